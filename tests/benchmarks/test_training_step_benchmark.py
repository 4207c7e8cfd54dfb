"""The training-step benchmark's --smoke run: both kernels train the same model, and the JSON has its fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_smoke_run_times_both_kernels(tmp_path: Path) -> None:
    module = load_benchmark("kernels/training_step.py")

    path = module.main(["--smoke", "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path.name == "kernels-training-step-cpu-smoke.json" and result["smoke"] is True
    assert [c["name"] for c in result["cases"]] == ["smoke", "smoke-sampled"]
    for case in result["cases"]:
        assert case["torch_ms"] > 0 and case["triton_ms"] > 0 and case["targets_per_step"] > 0
        assert case["ratio_vs_torch"] == pytest.approx(case["torch_ms"] / case["triton_ms"], rel=1e-2)
