"""Trainer for next-item sequential retrievers: epochs, early stopping on validation, best checkpoint.

Checkpoints are chosen on validation metrics only; the caller evaluates the test split once, after.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from recsys.data.prepared import SequenceData
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.generative import GenerativeRetriever
from recsys.models.sasrec import SASRec
from recsys.training.device import resolve_device, use_bf16_autocast
from recsys.training.recipes import Recipe, recipe_for

logger = logging.getLogger(__name__)

EpochCallback = Callable[[int, dict[str, float]], None]
Trainable = SASRec | GenerativeRetriever


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200
    batch_size: int = 16  # SASRec: packed rows of max_len tokens (Beauty: ~40 targets each); generative: pairs
    lr: float = 1e-3
    weight_decay: float = 0.0
    loss: Literal["full_softmax", "sampled_softmax"] = "full_softmax"
    num_negatives: int = 1024  # sampled_softmax only; negatives drawn by training popularity (logQ-corrected)
    patience: int = 10  # epochs without a better validation metric before stopping
    monitor: str = "ndcg@10"  # validation metric that picks the checkpoint
    eval_every: int = 1
    seed: int = 0
    device: str = "auto"  # "auto" = cuda when available, else cpu
    # "auto": bf16 autocast on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16 / AMX), else fp32.
    # Embedding tables, optimizer state and the softmax stay fp32 either way.
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    progress: bool = True


@dataclass
class FitResult:
    best_epoch: int
    best_valid: dict[str, float]
    train_seconds: float
    epoch_seconds: list[float] = field(default_factory=list)  # training part of each epoch
    valid_seconds: list[float] = field(default_factory=list)  # validation after each evaluated epoch

    @property
    def seconds_per_epoch(self) -> float:
        """Median wall time of the training part of an epoch (validation excluded)."""
        return _median(self.epoch_seconds)

    @property
    def valid_seconds_per_epoch(self) -> float:
        """Median wall time of one validation pass (full ranking of every user)."""
        return _median(self.valid_seconds)


def _median(values: list[float]) -> float:
    return float(torch.tensor(values).median()) if values else 0.0


def fit(
    model: Trainable,
    data: SequenceData,
    config: TrainConfig,
    eval_config: EvalConfig,
    on_epoch_end: EpochCallback | None = None,
) -> FitResult:
    """Train `model` in place, restore its best-on-validation weights, and report the run.

    Args:
        model: the retriever (moved to the configured device).
        data: prepared dataset; trains on `training_sequences()`, validates on `eval_split("valid")`.
        config: optimisation and early-stopping settings.
        eval_config: how validation is ranked (ks, exclusion, batch size).
        on_epoch_end: called with (epoch, metrics) after every validated epoch, e.g. to log to MLflow.
    """
    _check_monitor(config.monitor, eval_config)
    device = resolve_device(config.device)
    model.to(device)
    use_bf16 = use_bf16_autocast(config.precision, device)
    logger.info("training on %s, bf16 autocast %s", device, use_bf16)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sequences, valid = data.training_sequences(), data.eval_split("valid")
    recipe = recipe_for(model, data, config.batch_size, config.loss, config.num_negatives)
    result = FitResult(best_epoch=0, best_valid={}, train_seconds=0.0)
    best_state, best_score, start = None, float("-inf"), time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        t0 = time.perf_counter()
        batches = recipe.batches(sequences, generator)
        loss = train_one_epoch(model, recipe, batches, optimizer, use_bf16, config.progress, generator)
        result.epoch_seconds.append(time.perf_counter() - t0)
        if epoch % config.eval_every and epoch != config.epochs:
            continue
        model.eval()
        t0 = time.perf_counter()
        metrics = {"loss": loss, **evaluate(model, valid, data.num_items, eval_config).metrics}
        result.valid_seconds.append(time.perf_counter() - t0)
        metrics["epoch_seconds"] = result.epoch_seconds[-1]
        if on_epoch_end is not None:
            on_epoch_end(epoch, metrics)
        logger.info("epoch %d loss %.4f valid %s %.4f", epoch, loss, config.monitor, metrics[config.monitor])
        if metrics[config.monitor] > best_score:
            best_score, result.best_epoch, result.best_valid = metrics[config.monitor], epoch, metrics
            best_state = copy.deepcopy(model.state_dict())
        elif epoch - result.best_epoch >= config.patience:
            logger.info(
                "early stop at epoch %d: best %s %.4f at epoch %d",
                epoch,
                config.monitor,
                best_score,
                result.best_epoch,
            )
            break
    result.train_seconds = time.perf_counter() - start
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return result


def train_one_epoch(
    model: nn.Module,
    recipe: Recipe,
    batches: Sequence[Any],
    optimizer: torch.optim.Optimizer,
    use_bf16: bool,
    progress: bool,
    generator: torch.Generator,
) -> float:
    """One pass over `batches`; returns the mean loss per target."""
    model.train()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    # disable=None: a bar on terminals only, so logs and CI output stay clean
    for batch in tqdm(batches, desc="train", leave=False, disable=None if progress else True, unit="batch"):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, n = recipe.loss(model, batch.to(device), generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.item() * n
        count += n
    return total / max(count, 1)


def _check_monitor(monitor: str, eval_config: EvalConfig) -> None:
    """Fail before training, not after the first epoch, when the monitored metric will not exist."""
    valid = {"mrr", *(f"{m}@{k}" for m in ("recall", "ndcg", "coverage") for k in eval_config.ks)}
    if monitor not in valid:
        raise ConfigError(
            f"train.monitor {monitor!r} is not computed. Fix: use one of {', '.join(sorted(valid))} (eval.ks sets k)"
        )
