"""Trainer for next-item sequential retrievers: epochs, early stopping on validation, best checkpoint.

Checkpoints are chosen on validation metrics only; the caller evaluates the test split once, after.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from recsys.data.prepared import SequenceData
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.domain_adapters import DomainAdaptedRetriever
from recsys.models.generative import GenerativeRetriever
from recsys.models.hstu import HSTU
from recsys.models.ranker import TwoStageRanker
from recsys.models.sasrec import SASRec
from recsys.models.two_tower import TwoTower
from recsys.modules.moe import expert_load
from recsys.runtime.checkpoint import load_checkpoint, save_checkpoint
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.training.averaging import WeightAverage
from recsys.training.recipes import Recipe, recipe_for

logger = logging.getLogger(__name__)

EpochCallback = Callable[[int, dict[str, float]], None]
Trainable = SASRec | HSTU | GenerativeRetriever | TwoStageRanker | TwoTower | DomainAdaptedRetriever


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200
    batch_size: int = 16  # SASRec, HSTU: packed rows of max_len tokens (Beauty: ~40 targets each); generative: pairs
    lr: float = 1e-3
    # "cosine": linear warm-up over `warmup_steps`, then cosine decay to 0 at the last planned epoch;
    # "constant": `lr` throughout (after the warm-up, if any).
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    loss: Literal["full_softmax", "sampled_softmax"] = "full_softmax"
    # sampled_softmax: negatives drawn by training popularity (logQ-corrected); two-tower: uniform random negatives
    num_negatives: int = 1024
    label_smoothing: float = 0.0  # generative only: smoothing of the cross-entropy on each semantic-ID level
    # > 0: train without each user's last `holdout_last` training items (a first stage whose ranker learns on
    # them: RankerConfig.holdout_retriever_dir); validation and test are unchanged
    holdout_last: int = 0
    # SASRec / HSTU full softmax on multi-domain data: each target's softmax runs over its own domain's items only
    # (the items it will be ranked against), not the whole catalog
    softmax_within_domain: bool = False
    # > 0: validate, checkpoint and save an exponential moving average of the weights (decay per step, e.g.
    # 0.999 averages over ~1,000 steps) instead of the last step's weights; 0 = off
    ema_decay: float = 0.0
    patience: int = 10  # epochs without a better validation metric before stopping
    max_train_seconds: float | None = None  # stop after the first validated epoch past this wall time
    monitor: str = "ndcg@10"  # validation metric that picks the checkpoint
    eval_every: int = 1
    seed: int = 0
    device: str = "auto"  # "auto" = cuda when available, else cpu
    # "auto": bf16 autocast on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16 / AMX), else fp32.
    # Embedding tables, optimizer state and the softmax stay fp32 either way.
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    progress: bool = True
    compile: bool = False  # torch.compile the training forward (fewer kernel launches; first epoch pays compiling)


@dataclass
class FitResult:
    best_epoch: int
    best_valid: dict[str, float]
    train_seconds: float
    epoch_seconds: list[float] = field(default_factory=list)  # training part of each epoch
    valid_seconds: list[float] = field(default_factory=list)  # validation after each evaluated epoch
    # models with MoE layers: per validated epoch, the share of routed slots per expert in that epoch's training
    expert_load: list[dict[str, Any]] = field(default_factory=list)

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
    state_path: Path | None = None,
) -> FitResult:
    """Train `model` in place, restore its best-on-validation weights, and report the run.

    Args:
        model: the retriever (moved to the configured device).
        data: prepared dataset; trains on `training_sequences()`, validates on `eval_split("valid")`.
        config: optimisation and early-stopping settings.
        eval_config: how validation is ranked (ks, exclusion, batch size).
        on_epoch_end: called with (epoch, metrics) after every validated epoch, e.g. to log to MLflow.
        state_path: resumable training state, rewritten atomically after every validated epoch; when it
            exists and was written for the same model and settings, training resumes from it.
    """
    _check_monitor(config.monitor, eval_config)
    device = resolve_device(config.device)
    model.to(device)
    use_bf16 = use_bf16_autocast(config.precision, device)
    logger.info("training on %s, bf16 autocast %s", device, use_bf16)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    # fused Adam: one kernel for the whole update instead of several per parameter (CUDA only)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=device.type == "cuda"
    )
    sequences, valid = data.training_sequences(), data.eval_split("valid")
    timestamps = data.training_timestamps() if getattr(model, "reads_timestamps", False) else None
    if config.holdout_last:
        sequences = sequences.truncate_last(config.holdout_last)
        timestamps = None if timestamps is None else timestamps.truncate_last(config.holdout_last)
    recipe = recipe_for(
        model,
        data,
        config.batch_size,
        config.loss,
        config.num_negatives,
        config.label_smoothing,
        config.softmax_within_domain,
    )
    # the cosine schedule needs the epoch length: count one epoch's batches (a throw-away shuffle)
    cosine = config.lr_schedule == "cosine"
    steps_per_epoch = len(recipe.batches(sequences, torch.Generator(), timestamps)) if cosine else 0
    scheduler = _lr_scheduler(optimizer, config, steps_per_epoch)
    average = WeightAverage(model, config.ema_decay) if config.ema_decay else None
    state = _TrainingState(model, optimizer, scheduler, generator, _run_key(model, config), average)
    if state_path is not None:
        state.resume(state_path)
    if config.compile:
        model.compile()  # the training forward only: generation and scoring call other methods
    result = state.result
    start = time.perf_counter() - result.train_seconds
    first_epoch = config.epochs + 1 if state.early_stopped else state.epoch + 1  # an early stop is final
    for epoch in range(first_epoch, config.epochs + 1):
        t0 = time.perf_counter()
        expert_load(model)  # count this epoch's routing only (validation routes examples too)
        batches = recipe.batches(sequences, generator, timestamps)
        loss = train_one_epoch(
            model, recipe, batches, optimizer, scheduler, use_bf16, config.progress, generator, average
        )
        result.epoch_seconds.append(time.perf_counter() - t0)
        if epoch % config.eval_every and epoch != config.epochs:
            continue
        load = expert_load(model)  # this epoch's training batches
        model.eval()
        t0 = time.perf_counter()
        # with EMA on, the averaged weights are the ones validated and kept
        with average.applied() if average is not None else contextlib.nullcontext():
            metrics = {"loss": loss, **evaluate(model, valid, data.num_items, eval_config).metrics}
            improved = metrics[config.monitor] > state.best_score
            if improved:
                state.best_weights = copy.deepcopy(model.state_dict())
        result.valid_seconds.append(time.perf_counter() - t0)
        metrics["epoch_seconds"] = result.epoch_seconds[-1]
        if load is not None:
            metrics["expert_load_max_over_mean"] = float(load["max_over_mean"])  # type: ignore[arg-type]
            result.expert_load.append({"epoch": epoch, **load})
        if on_epoch_end is not None:
            on_epoch_end(epoch, metrics)
        logger.info("epoch %d loss %.4f valid %s %.4f", epoch, loss, config.monitor, metrics[config.monitor])
        if improved:
            state.best_score, result.best_epoch, result.best_valid = metrics[config.monitor], epoch, metrics
        state.epoch, result.train_seconds = epoch, time.perf_counter() - start
        state.early_stopped = epoch - result.best_epoch >= config.patience
        if state_path is not None:
            state.save(state_path)
        if state.early_stopped:
            logger.info(
                "early stop at epoch %d: best %s %.4f at epoch %d",
                epoch,
                config.monitor,
                state.best_score,
                result.best_epoch,
            )
            break
        if config.max_train_seconds is not None and result.train_seconds > config.max_train_seconds:
            logger.warning(
                "time budget of %.0f s spent after epoch %d; stopping (a larger budget resumes from here)",
                config.max_train_seconds,
                epoch,
            )
            break
    result.train_seconds = time.perf_counter() - start
    if state.best_weights is not None:
        model.load_state_dict(state.best_weights)
    model.eval()
    return result


class _TrainingState:
    """Everything needed to continue a run after its last validated epoch, saved and restored as one file."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        generator: torch.Generator,
        run_key: str,
        average: WeightAverage | None,
    ) -> None:
        self.model, self.optimizer, self.scheduler, self.generator = model, optimizer, scheduler, generator
        self.average = average
        self.run_key = run_key
        self.epoch = 0
        self.early_stopped = False
        self.best_score = float("-inf")
        self.best_weights: dict[str, Any] | None = None
        self.result = FitResult(best_epoch=0, best_valid={}, train_seconds=0.0)

    def save(self, path: Path) -> None:
        save_checkpoint(
            path,
            {
                "run_key": self.run_key,
                "epoch": self.epoch,
                "early_stopped": self.early_stopped,
                "best_score": self.best_score,
                "best_weights": self.best_weights,
                "result": dataclasses.asdict(self.result),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "generator": self.generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "average": None if self.average is None else self.average.state_dict(),
            },
        )

    def resume(self, path: Path) -> None:
        """Load `path` when it belongs to this run; otherwise keep the fresh state (and say why)."""
        if not path.is_file():
            return
        saved = load_checkpoint(path)
        if saved.get("run_key") != self.run_key:
            logger.warning("%s was written for another model or settings; starting from epoch 1", path)
            return
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.generator.set_state(saved["generator"])
        if self.average is not None:
            self.average.load_state_dict(saved["average"])
        torch.set_rng_state(saved["torch_rng"])
        self.epoch, self.early_stopped = saved["epoch"], saved["early_stopped"]
        self.best_score, self.best_weights = saved["best_score"], saved["best_weights"]
        self.result = FitResult(**saved["result"])
        logger.info("resumed from %s after epoch %d (%.0f s trained)", path, self.epoch, self.result.train_seconds)


def _run_key(model: nn.Module, config: TrainConfig) -> str:
    """What must match for a saved state to be resumed: the model's settings and the optimisation settings.

    The time budget, patience, progress bar and compilation may change between attempts, and so may the
    epoch count under a constant learning rate (a cosine schedule is planned over it, so there it must not).
    """
    resumable = {"max_train_seconds", "patience", "progress", "compile"}
    if config.lr_schedule == "constant":
        resumable.add("epochs")
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in resumable}
    return f"{type(model).__name__}|{getattr(model, 'config', None)!r}|{settings!r}"


def train_one_epoch(
    model: nn.Module,
    recipe: Recipe,
    batches: Sequence[Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    use_bf16: bool,
    progress: bool,
    generator: torch.Generator,
    average: WeightAverage | None = None,
) -> float:
    """One pass over `batches` (one scheduler step, and `average` update, per batch); returns the mean loss per
    target."""
    model.train()
    device = next(model.parameters()).device
    total, count = torch.zeros((), device=device), 0  # summed on the device: no host sync per step
    # disable=None: a bar on terminals only, so logs and CI output stay clean
    for batch in tqdm(batches, desc="train", leave=False, disable=None if progress else True, unit="batch"):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, n = recipe.loss(model, batch.to(device), generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if average is not None:
            average.update()
        total += loss.detach().float() * n
        count += n
    return float(total) / max(count, 1)


def _lr_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-step multiplier of `config.lr`: linear warm-up, then constant or cosine decay over the planned epochs."""
    warmup, total = config.warmup_steps, max(1, config.epochs * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if config.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _check_monitor(monitor: str, eval_config: EvalConfig) -> None:
    """Fail before training, not after the first epoch, when the monitored metric will not exist."""
    valid = {"mrr", *(f"{m}@{k}" for m in ("recall", "ndcg", "coverage") for k in eval_config.ks)}
    if monitor not in valid:
        raise ConfigError(
            f"train.monitor {monitor!r} is not computed. Fix: use one of {', '.join(sorted(valid))} (eval.ks sets k)"
        )
