"""benchmarks.distributed: the smoke config end to end on CPU processes (gloo): one process, two, and two with the
item table split by rows, each started by torch's elastic launcher, and their report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.distributed as distributed
from benchmarks.common import REPO

SMOKE = "benchmarks/configs/distributed-smoke.yaml"


def test_smoke_run_reports_each_configuration(tmp_path: Path) -> None:
    overrides = ["--set", f"data_dir={tmp_path / 'data'}"]
    result = json.loads(distributed.main(["--config", SMOKE, "--results-dir", str(tmp_path), *overrides]).read_text())

    assert result["world_sizes"] == [1, 2] and result["backend"] == "gloo" and "versions" in result
    runs = result["throughput"]["sasrec"]
    assert [(run["processes"], run["item_table"]) for run in runs] == [
        (1, "replicated"), (2, "replicated"), (2, "row_sharded")
    ]  # fmt: skip
    settings = distributed.load_settings(Path(SMOKE), {})
    for run in runs:
        assert run["rows_per_step"] == settings.rows_per_process * run["processes"]
        assert run["tokens_per_second"] > 0 and len(run["peak_memory_gib_per_process"]) == run["processes"]
    for run in runs[1:]:  # tokens/s of N processes over N times one process's
        expected = run["tokens_per_second"] / (2 * runs[0]["tokens_per_second"])
        assert run["scaling_efficiency"] == pytest.approx(expected, rel=1e-3)


def test_the_4_gpu_config_runs_1_2_and_4_processes_and_refuses_counts_out_of_range() -> None:
    settings = distributed.load_settings(REPO / "benchmarks/configs/distributed-4gpu.yaml", {})
    assert distributed._world_sizes(settings) == [1, 2, 4] and settings.result_name == "distributed-4gpu-h200"
    with pytest.raises(SystemExit, match="strictly between 1 and processes"):
        distributed._world_sizes(
            distributed.load_settings(REPO / "benchmarks/configs/distributed.yaml", {"between": [2]})
        )
