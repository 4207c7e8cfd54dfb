"""The training-step benchmark's --smoke run: both kernels train the same model, and the JSON has its fields."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "training_step.py"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_smoke_run_times_both_kernels(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("training_step_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)

    path = module.main(["--smoke", "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path.name == "kernels-training-step-cpu-smoke.json" and result["smoke"] is True
    assert [c["name"] for c in result["cases"]] == ["smoke", "smoke-sampled"]
    for case in result["cases"]:
        assert case["torch_ms"] > 0 and case["triton_ms"] > 0 and case["targets_per_step"] > 0
        assert case["ratio_vs_torch"] == pytest.approx(case["torch_ms"] / case["triton_ms"], rel=1e-2)
