"""The training-step benchmark's smoke config: both kernels train the same model, and the JSON has its fields and how
to reproduce it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.common import REPO
from benchmarks.kernels import training_step
from benchmarks.kernels.embedding_bag import gpu_name
from benchmarks.reproduce import problems_of

pytestmark = pytest.mark.kernels

SMOKE = "benchmarks/configs/kernels-training-step-smoke.yaml"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_smoke_run_times_both_kernels(tmp_path: Path) -> None:
    path = training_step.main(["--config", str(REPO / SMOKE), "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    _, slug = gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))  # "cpu" on a CPU machine
    assert path.name == f"kernels-training-step-{slug}-smoke.json" and result["smoke"] is True
    assert [(c["name"], c["model"]) for c in result["cases"]] == [
        ("smoke", "sasrec"),
        ("smoke-sampled", "sasrec"),
        ("smoke-hstu", "hstu"),
    ]
    assert [c["loss"] for c in result["cases"]] == ["full_softmax", "sampled_softmax", "sampled_softmax"]
    for case in result["cases"]:
        assert case["max_history"] == 8 and case["num_items"] == 40
        assert case["torch_ms"] > 0 and case["triton_ms"] > 0 and case["targets_per_step"] > 0
        assert case["ratio_vs_torch"] == pytest.approx(case["torch_ms"] / case["triton_ms"], rel=1e-2)
    assert {"machine", "versions", "command", "timer"} <= set(result)
    assert result["reproduce"] == {"benchmark": "benchmarks.kernels.training_step", "config": SMOKE, "overrides": {}}
    assert problems_of(path) == []


def test_the_full_config_loads_its_cases() -> None:
    settings = training_step.load_settings(REPO / "benchmarks/configs/kernels-training-step.yaml", {})
    assert [(c.name, c.model, c.num_items, c.loss) for c in settings.cases] == [
        ("beauty", "sasrec", 12_101, "full_softmax"),
        ("catalog-1m", "sasrec", 1_000_000, "sampled_softmax"),
        ("hstu-catalog-1m", "hstu", 1_000_000, "sampled_softmax"),
    ]
    assert settings.smoke is False
