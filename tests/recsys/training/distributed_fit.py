"""What each process of the data-parallel tests runs (an importable module: the launcher's processes import it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from recsys.data.prepared import SequenceData, load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.distributed import Workers, join, leave
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.recipes import NextItemTraining, Recipe, recipe_for
from recsys.training.trainer import TrainConfig, fit

EVAL = EvalConfig(ks=(10,), batch_size=64)
# one thread and no dropout: what is left between one process and two is the order of float sums
# two batches a step: the processes keep their gradients to themselves between updates (DDP no_sync)
TRAIN = TrainConfig(
    epochs=2, batch_size=8, accumulate_batches=2, lr=1e-3, patience=5, seed=3, device="cpu", threads=1, progress=False
)


def small_sasrec(num_items: int) -> SASRec:
    torch.manual_seed(0)
    config = SASRecConfig(num_items=num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.0,
                          attn_dropout=0.0)  # fmt: skip
    return SASRec(config)


def recipe_of(model: SASRec, data: SequenceData) -> Recipe:
    return recipe_for(model, data, TRAIN.batch_size, NextItemTraining(loss="full_softmax"))


def first_step_gradients(data: SequenceData, workers: Workers, device: torch.device) -> dict[str, torch.Tensor]:
    """The gradients of the first batch of an epoch, as this process's share of it gives them after DDP's average."""
    model = small_sasrec(data.num_items).to(device)
    recipe = recipe_of(model, data)
    generator = torch.Generator().manual_seed(TRAIN.seed)
    batch = next(batch for rows in data.training_epoch(generator) for batch in recipe.batches(rows, generator))
    batch = batch.to(device)
    step_loss = DataParallelLoss(model, recipe, workers, find_unused_parameters=False)  # alive through backward:
    loss, _, _ = step_loss(batch, generator)  # DDP averages the gradients in hooks its reducer holds
    loss.backward()
    grads = {name: p.grad.cpu() for name, p in model.named_parameters() if p.grad is not None}
    return grads


def train_and_save(data_dir: str, out: str, device: str = "cpu") -> None:
    """One step's gradients, then two epochs of training, of a small SASRec on `data_dir` (on `device`: "cpu" under
    gloo, "cuda" under NCCL); the first process writes the gradients, trained weights and test ranks to `out`."""
    torch.set_num_threads(1)
    data = load_prepared(Path(data_dir))
    workers = join(torch.device(device))
    gradients = first_step_gradients(data, workers, workers.device(torch.device(device)))
    model = small_sasrec(data.num_items)
    train = dataclasses.replace(TRAIN, device=device, precision="fp32")
    result = fit(model, data, train, EVAL, recipe_of(model, data))
    test = evaluate(model, data.eval_split("test"), data.num_items, EVAL, workers=workers)
    if workers.is_main:
        weights = {name: tensor.cpu() for name, tensor in model.state_dict().items()}
        torch.save({"gradients": gradients, "weights": weights, "ranks": test.ranks,
                    "metrics": test.metrics, "best_valid": result.best_valid}, out)  # fmt: skip
    leave()
