"""The two-tower on CUDA: an ID-only sequence two-tower (Sports' configuration) trains under bf16 autocast as it does
in fp32 (its MLP heads once collapsed there: training loss 0.01, validation at popularity), and alike with the Triton
and the torch lookups. Skips without a CUDA device, runs where there is one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from recsys.data.prepared import SequenceData, load_prepared
from recsys.evaluation import EvalConfig
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.training.recipes import TwoTowerTraining, recipe_for
from recsys.training.trainer import fit
from tests.conftest import quick_train


def _epoch_losses(
    data: SequenceData, kernel: Literal["torch", "triton"], precision: Literal["bf16", "fp32"], device: str = "cuda"
) -> list[float]:
    """The training loss of each of 3 epochs of a small ID-only sequence two-tower (seed 0) on `data`."""
    torch.manual_seed(0)
    config = TwoTowerConfig(num_items=data.num_items, max_history=20, dim=32, hidden_dim=64, dropout=0.2,
                            user_tower="sequence", embedding_kernel=kernel)  # fmt: skip
    model = TwoTower(config)
    train = quick_train(3, 32, 3e-3)
    train = dataclasses.replace(train, hardware=dataclasses.replace(train.hardware, device=device, precision=precision))
    losses: list[float] = []

    def on_epoch_end(epoch: int, metrics: dict[str, Any]) -> None:
        losses.append(float(metrics["loss"]))

    recipe = recipe_for(model, data, train.optimization.batch_size, TwoTowerTraining(64))
    fit(model, data, train, EvalConfig(ks=(10,)), recipe, on_epoch_end)
    return losses


@pytest.mark.gpu
def test_an_id_only_sequence_two_tower_trains_alike_in_bf16_and_fp32_and_with_either_lookup(
    tiny_data_dir: Path,
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: run it on a machine with one")
    data = load_prepared(tiny_data_dir)
    fp32 = _epoch_losses(data, "torch", "fp32")
    assert fp32[-1] > 1.0, "a softmax over the batch and 64 random items cannot be fitted to ~0 in 3 epochs honestly"
    assert _epoch_losses(data, "torch", "bf16") == pytest.approx(fp32, rel=0.05)
    assert _epoch_losses(data, "triton", "bf16") == pytest.approx(fp32, rel=0.05)
