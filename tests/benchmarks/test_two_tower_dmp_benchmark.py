"""benchmarks.two_tower_dmp on its smoke config: DMP on one and on two gloo processes times its steps, the
JSON states the world size, backend, versions and both plans, and reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.two_tower_dmp as two_tower_dmp
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of

SMOKE = "benchmarks/configs/two-tower-dmp-smoke.yaml"


def test_smoke_run_times_dmp_on_one_and_two_processes_and_records_the_plans(tmp_path: Path) -> None:
    path = two_tower_dmp.main(["--config", str(REPO / SMOKE), "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())

    assert path.name == "two-tower-dmp-smoke.json"
    assert (result["world_size"], result["backend"], result["device"]) == (2, "gloo", "cpu")
    assert {"torch", "torchrec", "fbgemm-gpu-cpu"} <= set(result["versions"]) and "machine" in result
    assert list(result["runs"]) == ["one_process_dmp", "model_parallel"]
    assert [run["processes"] for run in result["runs"].values()] == [1, 2]
    assert {run["backend"] for run in result["runs"].values()} == {"gloo"}
    assert all(run["samples_per_s"] > 0 and run["median_step_ms"] > 0 for run in result["runs"].values())
    ran = result["plans"]["table_wise_cpu_ran"]
    assert {t["table"] for t in ran} == {"history", "recent", "item_id"}
    assert {t["sharding"] for t in ran} == {"table_wise"} and {tuple(t["ranks"]) for t in ran} == {(0,), (1,)}
    assert {tuple(t["ranks"]) for t in result["plans"]["row_wise_cuda_planned_only"]} == {(0, 1)}
    assert result["reproduce"] == {"benchmark": "benchmarks.two_tower_dmp", "config": SMOKE, "overrides": {}}
    assert problems_of(path) == []
