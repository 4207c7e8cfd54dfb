"""The serving load test, short, on the synthetic config made tiny: wrk against a real `recsys serve` of one and of
two worker processes sharing a real Redis; the result reproduces from its config."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import benchmarks.serving as serving
from benchmarks.reproduce import problems_of

TINY = {
    "data.options.num_users": 300,
    "data.options.num_items": 150,
    "model.params.max_history": 20,
    "model.params.dim": 32,
    "model.params.num_heads": 1,
    "model.params.ffn_dim": 64,
    "train.epochs": 1,
}


def test_short_load_test_writes_the_issue_fields(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs wrk (.ci/run installs it)")
        pytest.skip("wrk is not installed (apt-get install -y wrk)")

    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    args = ["--config", "configs/synthetic/sasrec.yaml", *sets, "--work-dir", str(tmp_path / "work"),
            "--duration", "2", "--connections", "2", "--model-calls", "20", "--freshness-trials", "10",
            "--workers", "1", "2", "--history-store", "redis", "--results-dir", str(tmp_path)]  # fmt: skip
    path = serving.main(args)
    result = json.loads(path.read_text())
    assert path.name == "serving-synthetic-redis.json" and result["name"] == "serving-synthetic-redis"
    assert [run["workers"] for run in result["runs"]] == [1, 2]
    for run in result["runs"]:
        assert run["requests"] > 0 and run["requests_per_second"] > 0 and run["errors"] == 0
        assert 0 < run["latency_ms"]["p50"] <= run["latency_ms"]["p95"] <= run["latency_ms"]["p99"]
        swap = run["hot_swap"]  # the admin reload or a worker's own check (every second) swapped it in
        assert swap["errors"] == 0 and swap["every_worker_serves_it"]
    assert [run["hot_swap"]["promoted_version"] for run in result["runs"]] == ["2", "3"]
    assert 0 < result["model_call_ms"]["p50"] <= result["model_call_ms"]["p99"]
    assert 0 < result["freshness_ms"]["p50"] <= result["freshness_ms"]["p99"]
    one = result["runs"][0]
    batching = one["server_batching"]  # every wrk request went through a model call (the mean has 4 digits)
    assert batching["model_calls"] * batching["mean_requests_per_call"] >= one["requests"] * (1 - 5e-4)
    assert batching["mean_requests_per_call"] >= 1 and batching["mean_model_call_ms"] > 0
    assert "server_batching" not in result["runs"][1]  # each worker counts its own calls
    assert {"concurrency", "machine", "command"} <= set(result)
    assert result["load_test"] == {
        "duration_s": 2, "connections": 2, "model_calls": 20, "freshness_trials": 10, "workers": [1, 2],
        "history_store": "redis",
    }  # fmt: skip
    assert result["bundle"]["index"] == "hnsw" and result["bundle"]["train_epochs"] == 1
    assert result["settings"]["model"]["params"]["dim"] == 32

    # every --set, and the benchmark's own HNSW index, are the result's overrides
    assert result["reproduce"] == {
        "benchmark": "benchmarks.serving",
        "config": "configs/synthetic/sasrec.yaml",
        "overrides": {"pipeline.index.kind": "hnsw", **TINY},
    }
    assert problems_of(path) == []
