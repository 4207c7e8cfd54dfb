"""The MoE-heads benchmark on a small synthetic run: every variant, its test metrics, load and step time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.conftest import load_benchmark


def test_small_run_writes_every_variant(tmp_path: Path) -> None:
    path = load_benchmark("moe_heads.py").main(
        ["--users", "200", "--epochs", "1", "--results-dir", str(tmp_path), "--name", "smoke"]
    )
    result = json.loads(path.read_text())
    models = {m["model"]: m for m in result["models"]}
    assert len(models) == 6
    for model in models.values():
        assert model["step_ms"] > 0
        assert set(model["test"]) >= {"purchase_auc"} or set(model["test"]) >= {"rating_rmse"}
    moe, dense = models["moe multi-task, bias balancing"], models["dense multi-task"]
    assert moe["test"]["load_max_over_mean"] >= 1.0 and "load_max_over_mean" not in dense["test"]
    # equal active size within the routers' parameters
    assert abs(moe["head_active_parameters"] - dense["head_active_parameters"]) / dense["head_active_parameters"] < 0.2


def test_auc_matches_the_pairwise_definition() -> None:
    auc = load_benchmark("moe_heads.py").auc
    scores, labels = torch.tensor([0.1, 0.4, 0.35, 0.8, 0.4]), torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])
    pairs = [(p, n) for p in (2, 3, 4) for n in (0, 1)]
    expected = sum(1.0 if scores[p] > scores[n] else 0.5 if scores[p] == scores[n] else 0.0 for p, n in pairs) / 6
    assert auc(scores, labels) == pytest.approx(expected)
