"""The two-tower on CUDA, where its lookups run through the Triton kernels: an ID-only sequence two-tower (Sports'
configuration) trains as it does with the torch lookups. Skips without a CUDA device, runs where there is one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.training.recipes import TwoTowerTraining, recipe_for
from recsys.training.trainer import fit
from tests.conftest import popularity_valid_metric, quick_train


@pytest.mark.gpu
def test_an_id_only_sequence_two_tower_trains_alike_with_triton_and_torch_lookups(tiny_data_dir: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: run it on a machine with one")
    data = load_prepared(tiny_data_dir)
    eval_config = EvalConfig(ks=(10,))
    runs: dict[str, tuple[list[float], float]] = {}
    for kernel in ("torch", "triton"):
        torch.manual_seed(0)
        config = TwoTowerConfig(num_items=data.num_items, max_history=20, dim=32, hidden_dim=64, dropout=0.0,
                                user_tower="sequence", embedding_kernel=kernel)  # fmt: skip
        model = TwoTower(config)
        train = quick_train(4, 32, 3e-3)
        losses: list[float] = []

        def on_epoch_end(epoch: int, metrics: dict[str, Any], losses: list[float] = losses) -> None:
            losses.append(float(metrics["loss"]))

        recipe = recipe_for(model, data, train.optimization.batch_size, TwoTowerTraining(64))
        result = fit(model.cuda(), data, train, eval_config, recipe, on_epoch_end)
        runs[kernel] = losses, result.best_valid["ndcg@10"]
    (torch_losses, torch_valid), (triton_losses, triton_valid) = runs["torch"], runs["triton"]
    assert triton_losses == pytest.approx(torch_losses, rel=0.05), "the same training, whichever kernel looks up"
    assert triton_valid == pytest.approx(torch_valid, abs=0.02)
    assert triton_valid > 1.5 * popularity_valid_metric(data, eval_config)
