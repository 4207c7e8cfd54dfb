"""benchmarks.scale: the smoke config end to end (every step a real command in a child process), the P5 round trip,
the budget and failure paths, and the growth-exponent fit on known numbers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import benchmarks.scale as scale
from benchmarks.reproduce import problems_of
from recsys.errors import ConfigError

SMOKE = "benchmarks/configs/scale-smoke.yaml"
DATA_STEPS = ("generate", "prepare", "p5_text", "prepare_p5")
RECORD_KEYS = {"users", "items", "interactions", "status", "wall_s", "cpu_s", "peak_rss_gib", "disk_gib", "note"}


def _counts(prepared: Path) -> dict[str, int]:
    return json.loads((prepared / "meta.json").read_text())["counts"]


def test_smoke_run_measures_every_step_and_the_p5_text_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = ["--set", f"work_root={tmp_path / 'work'}", "--set", "keep_work=true"]
    path = scale.main(["--config", SMOKE, "--results-dir", str(tmp_path), *overrides])
    result = json.loads(path.read_text())
    settings = scale.load_settings(Path(SMOKE), {})
    assert result["sizes_done"] == "2 of 2" and list(result["steps"]) == list(settings.steps)
    for name, step in result["steps"].items():
        assert [(run["users"], run["items"]) for run in step["runs"]] == [(s.users, s.items) for s in settings.sizes]
        assert all(run.keys() == RECORD_KEYS for run in step["runs"]), name
        assert step["exponents"].keys() == set(scale.METRICS)
    for name in DATA_STEPS:
        for run in result["steps"][name]["runs"]:
            assert run["status"] == "ok", run
            assert 0 < run["cpu_s"] and 0 < run["wall_s"] < 60 and 0 < run["disk_gib"]
            assert 0.005 < run["peak_rss_gib"] < 2  # its own peak, not the parent's (torch imported: ~0.25 GiB)
        assert all(value is not None for value in result["steps"][name]["exponents"].values())
    for name in ("train_epoch", "evaluate"):  # the library's own steps, run at every size up to their max_users
        assert {run["status"] for run in result["steps"][name]["runs"]} == {"ok"}
    for name in ("index_build", "bundle_load", "serving_p99"):  # measured at 10^6 items by their own benchmarks
        assert {run["status"] for run in result["steps"][name]["runs"]} == {"skipped"}
        assert all(run["note"] and run["wall_s"] is None for run in result["steps"][name]["runs"])
    # the P5 text form of each size, prepared again, holds the interactions the synthetic prepare kept
    for size, run in zip(settings.sizes, result["steps"]["prepare_p5"]["runs"], strict=True):
        size_dir = Path(result["work_dir"]) / size.name
        synthetic, p5 = _counts(size_dir / "data"), _counts(size_dir / "prepared-p5")
        assert p5["interactions"] == synthetic["interactions"] == run["interactions"] > 10 * size.users
        assert (p5["users"], p5["items"]) == (synthetic["users"], synthetic["items"])
    assert problems_of(path) == []
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps({**result, "settings": {**result["settings"], "sizes": []}}))
    assert [problem.split(":")[0] for problem in problems_of(tampered)] == ["sizes"]
    capsys.readouterr()
    scale.main(["--config", SMOKE, "--table", str(path)])
    table = capsys.readouterr().out
    assert "| prepare_p5 | 3,000 | 2,000 |" in table and "| generate |" in table.split("exponent")[-1]


def test_growth_exponent_on_known_numbers() -> None:
    sizes = [1.7e6, 1.7e7, 1.7e8]
    assert scale.growth_exponent(sizes, [3e-6 * n**1.08 for n in sizes]) == 1.08
    assert scale.growth_exponent(sizes, [0.9, 0.9, 0.9]) == 0.0  # flat memory
    assert scale.growth_exponent([1e6, 1e6], [1.0, 2.0]) is None  # one size: nothing to fit
    runs = [
        {"interactions": 1_000, "status": "ok", "wall_s": 1.0, "cpu_s": 2.0, "peak_rss_gib": 0.5, "disk_gib": None},
        {"interactions": 10_000, "status": "ok", "wall_s": 100.0, "cpu_s": 20.0, "peak_rss_gib": 0.5, "disk_gib": None},
        {"interactions": 100_000, "status": "over_budget", **dict.fromkeys(scale.METRICS)},
    ]
    assert scale.exponents(runs) == {"wall_s": 2.0, "cpu_s": 1.0, "peak_rss_gib": 0.0, "disk_gib": None}


def _place(tmp_path: Path) -> scale.Place:
    return scale.Place(scale.Size(users=10, items=5), tmp_path)


def test_a_step_past_its_budget_is_killed_and_gets_no_figure(tmp_path: Path) -> None:
    step = scale.Step(command="{python} -c 'import time; time.sleep(60)'", budget_s=1.0)
    started = time.monotonic()
    record = scale.run_step("sleeper", step, _place(tmp_path), {})
    assert time.monotonic() - started < 30
    assert record["status"] == "over_budget" and record["note"] == "killed at its budget of 1 s"
    assert all(record[metric] is None for metric in scale.METRICS)


def test_a_failed_step_keeps_the_end_of_its_log_and_the_steps_after_it_skip(tmp_path: Path) -> None:
    failing = scale.Step(command="{python} -c 'raise SystemExit(\"no such data: {data_dir}\")'")
    record = scale.run_step("prepare", failing, _place(tmp_path), {})
    assert record["status"] == "failed" and record["wall_s"] is None
    assert record["note"] == f"exit code 1: no such data: {tmp_path / 'data'}"
    after = scale.run_step("p5_text", scale.Step(command="{python} -c pass", needs=("prepare",)), _place(tmp_path),
                           {"prepare": record})  # fmt: skip
    assert after["status"] == "skipped" and after["note"] == "needs prepare, which was failed at this size"
    limited = scale.Step(command="{python} -c pass", max_users=5, note="hours on 2 cores")
    assert scale.run_step("evaluate", limited, _place(tmp_path), {})["note"] == (
        "above this step's max_users (5): hours on 2 cores"
    )


def test_a_config_error_names_the_step_and_the_placeholder() -> None:
    with pytest.raises(ConfigError, match=r"steps\.prepare\.command: unknown placeholder\(s\) \['data'\]"):
        scale.load_settings(Path(SMOKE), {"steps.prepare.command": "{recsys} data prepare --out {data}"})
    with pytest.raises(ConfigError, match="p5_text needs 'nope'"):
        scale.load_settings(Path(SMOKE), {"steps.p5_text.needs": ["nope"]})


def test_the_child_reports_its_own_peak_not_the_parents(tmp_path: Path) -> None:
    ballast = bytearray(512 * 2**20)  # this process now holds > 0.5 GiB: a plain fork+exec would report that
    ballast[:: 2**12] = b"x" * len(ballast[:: 2**12])
    measured = scale.run_measured(f"{sys.executable} -c pass", 30, tmp_path / "pass.log")
    assert measured.returncode == 0 and measured.figures["peak_rss_gib"] < 0.1
