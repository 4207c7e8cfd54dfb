"""The serving load test, short, on the tiny synthetic config: wrk against a real `recsys serve` process."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark


def test_short_load_test_writes_the_issue_fields(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    if shutil.which("wrk") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs wrk (.ci/run installs it)")
        pytest.skip("wrk is not installed (apt-get install -y wrk)")
    module = load_benchmark("serving.py")

    config = tiny_config(tmp_path, pipeline={"index": {"kind": "flat"}})
    args = ["--config", str(config), "--work-dir", str(tmp_path / "work"), "--duration", "2", "--connections", "2",
            "--model-calls", "20", "--freshness-trials", "10", "--results-dir", str(tmp_path)]  # fmt: skip
    result = json.loads(Path(module.main(args)).read_text())
    assert result["requests"] > 0 and result["requests_per_second"] > 0 and result["errors"] == 0
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p95"] <= result["latency_ms"]["p99"]
    assert 0 < result["model_call_ms"]["p50"] <= result["model_call_ms"]["p99"]
    assert 0 < result["freshness_ms"]["p50"] <= result["freshness_ms"]["p99"]
    batching = result["server_batching"]  # every wrk request went through a model call
    assert batching["model_calls"] * batching["mean_requests_per_call"] >= result["requests"]
    assert batching["mean_requests_per_call"] >= 1 and batching["mean_model_call_ms"] > 0
    swap = result["hot_swap"]
    assert swap["reloaded"] is True and swap["promoted_version"] == "2" and swap["errors"] == 0
    assert {"concurrency", "duration_s", "machine", "command"} <= set(result)
