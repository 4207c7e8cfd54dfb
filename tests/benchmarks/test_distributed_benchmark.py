"""benchmarks.distributed: the smoke config end to end on CPU processes (gloo): one process, two, and two with the
item table split by rows, each started by torch's elastic launcher and running two per-process batches, their report
and the profile of the first batch."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

import benchmarks.distributed as distributed
from benchmarks.common import REPO

SMOKE = "benchmarks/configs/distributed-smoke.yaml"


def test_smoke_run_reports_each_configuration_and_batch_and_profiles_the_first(tmp_path: Path) -> None:
    overrides = ["--set", f"data_dir={tmp_path / 'data'}", "--set", f"profile_dir={tmp_path / 'profile'}"]
    result = json.loads(distributed.main(["--config", SMOKE, "--results-dir", str(tmp_path), *overrides]).read_text())

    assert result["world_sizes"] == [1, 2] and result["backend"] == "gloo" and "versions" in result
    runs = result["throughput"]["sasrec"]
    settings = distributed.load_settings(Path(SMOKE), {})
    configurations = [(1, "replicated"), (2, "replicated"), (2, "row_sharded")]
    assert [(run["rows_per_process"], run["processes"], run["item_table"]) for run in runs] == [
        (batch, *configuration) for batch in settings.per_process_batches for configuration in configurations
    ]
    for run in runs:
        assert run["rows_per_step"] == run["rows_per_process"] * run["processes"]
        assert run["tokens_per_second"] > 0 and len(run["peak_memory_gib_per_process"]) == run["processes"]
        assert run["timed_steps"] == settings.timed_steps and len(run["tokens_per_second_each_window"]) == 2
    efficiency = result["throughput"]["efficiency"]["sasrec"]
    for run in runs:  # tokens/s of N processes over N times one process's, at the same batch per process
        if run["processes"] == 2:
            single = next(r for r in runs if r["processes"] == 1 and r["rows_per_process"] == run["rows_per_process"])
            expected = run["tokens_per_second"] / (2 * single["tokens_per_second"])
            assert run["scaling_efficiency"] == pytest.approx(expected, rel=1e-3)
            assert 0 < run["scaling_efficiency_without_reading_and_packing"]
            assert efficiency[f"2 x {run['item_table']}"][str(run["rows_per_process"])] == run["scaling_efficiency"]

    # the profile: the first batch of every configuration, every process; its trace written where asked
    profiled = [run for run in runs if "profile" in run]
    assert {run["rows_per_process"] for run in profiled} == {settings.per_process_batches[0]} and len(profiled) == 3
    for run in profiled:
        assert sorted(run["profile"]) == [f"rank {rank}" for rank in range(run["processes"])]
        summary = run["profile"]["rank 0"]
        assert summary["steps"] == settings.profile_steps and summary["host_ms_per_step"] > 0
        assert "aten::item" in summary["host_waits_per_step"] and summary["operators"]
        assert "memory" not in summary  # the CUDA allocator's snapshot: on GPUs only
    traces = sorted(path.name for path in (tmp_path / "profile").iterdir())
    assert traces == sorted(
        f"sasrec-{n}-{table}-8-rank{rank}.trace.json.gz" for n, table in configurations for rank in range(n)
    )
    with gzip.open(tmp_path / "profile" / traces[0]) as trace:
        assert json.load(trace)["traceEvents"]


@pytest.mark.parametrize("warmup_epochs", [0, 1])
def test_windows_of_whole_epochs_hold_every_target_of_an_epoch_once(tmp_path: Path, warmup_epochs: int) -> None:
    overrides = {"data_dir": str(tmp_path / "data"), "users": 300, "per_process_batches": "[8]", "profile": "false",
                 "timed_epochs": 1, "row_sharded": "false", "warmup_epochs": warmup_epochs}  # fmt: skip
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    result = json.loads(distributed.main(["--config", SMOKE, "--results-dir", str(tmp_path), *sets]).read_text())

    one, two = result["throughput"]["sasrec"]
    # one epoch a window: every target of the epoch, once, whatever the processes (two pack apart, each its users),
    # and a warm-up epoch counted in none of them
    assert one["epochs_begun_while_timed"] == 2 == two["epochs_begun_while_timed"]
    assert one["tokens_timed"] == two["tokens_timed"] > 0


def test_the_4_gpu_config_runs_1_2_and_4_processes_and_refuses_counts_out_of_range() -> None:
    settings = distributed.load_settings(REPO / "benchmarks/configs/distributed-4gpu.yaml", {})
    assert distributed._world_sizes(settings) == [1, 2, 4] and settings.result_name == "distributed-4gpu-h200"
    with pytest.raises(SystemExit, match="strictly between 1 and processes"):
        distributed._world_sizes(
            distributed.load_settings(REPO / "benchmarks/configs/distributed.yaml", {"between": [2]})
        )


def test_the_h100_config_measures_three_batches_over_whole_epochs_and_profiles() -> None:
    settings = distributed.load_settings(REPO / "benchmarks/configs/distributed-2gpu-h100.yaml", {})
    assert settings.per_process_batches == (128, 512, 2048) and not settings.in_batch_negatives
    assert settings.profile and settings.result_name == "distributed-2gpu-h100" and settings.processes == 2
    assert settings.timed_epochs == 1 and settings.repeats == 3


def test_the_launches_config_measures_the_users_batch_three_times_in_turn() -> None:
    settings = distributed.load_settings(REPO / "benchmarks/configs/distributed-2gpu-launches.yaml", {})
    assert settings.per_process_batches == (2048,) and settings.launches == 3 and settings.warmup_epochs == 1
    assert not settings.profile and settings.timed_epochs == 1 and settings.row_sharded
    longer = distributed.load_settings(REPO / "benchmarks/configs/distributed-2gpu-launches-5-epochs.yaml", {})
    assert longer.timed_epochs == 5 and longer.repeats == 5 and longer.launches == 3


def test_a_row_over_launches_takes_every_measured_number_as_its_median() -> None:
    launches = [[{"processes": 2, "tokens_per_second": t, "seconds_per_step": s, "read_share": r, "timed_steps": 9}]
                for t, s, r in [(1.0e6, 0.09, 0.34), (3.0e6, 0.05, 0.27), (2.0e6, 0.07, 0.31)]]  # fmt: skip
    (row,) = distributed._over_launches(launches)
    assert (row["tokens_per_second"], row["seconds_per_step"], row["read_share"]) == (2.0e6, 0.07, 0.31)
    assert row["tokens_per_second_each_launch"] == [1.0e6, 3.0e6, 2.0e6] and "read_share_each_launch" not in row
    assert row["timed_steps"] == 9


def test_launches_interleave_the_configurations_and_report_each_launch_and_the_median(tmp_path: Path) -> None:
    overrides = {"data_dir": str(tmp_path / "data"), "users": 300, "per_process_batches": "[8]", "profile": "false",
                 "row_sharded": "false", "launches": 2, "repeats": 1}  # fmt: skip
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    result = json.loads(distributed.main(["--config", SMOKE, "--results-dir", str(tmp_path), *sets]).read_text())

    one, two = result["throughput"]["sasrec"]
    for row in (one, two):
        each = row["tokens_per_second_each_launch"]
        assert len(each) == 2 and all(value > 0 for value in each)
        assert row["tokens_per_second"] == pytest.approx(statistics.median(each), rel=1e-3)
    each = two["scaling_efficiency_each_launch"]  # each launch's 2 processes against the same launch's 1
    pairs = zip(one["tokens_per_second_each_launch"], two["tokens_per_second_each_launch"], strict=True)
    assert each == pytest.approx([t2 / (2 * t1) for t1, t2 in pairs], rel=1e-3)
    assert result["throughput"]["efficiency"]["sasrec"]["2 x replicated"]["8"] == two["scaling_efficiency"]
    assert two["scaling_efficiency"] == pytest.approx(statistics.median(each), rel=1e-3)
