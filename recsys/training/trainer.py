"""Trainer: epochs, validation, early stopping, the best checkpoint, resumable training state.

Checkpoints are chosen on validation metrics only; the caller evaluates the test split once, after. What differs
between model families (batches, loss) is the recipe's (`recsys.training.recipes`).

Started by the elastic launcher on several processes (`recsys.runtime.distributed`), the same `fit` trains through
the parallelism strategy it picks at start (`recsys.training.parallelism`: data parallel, the item table split by
rows, or tables sharded by DMP): each process takes its share of every batch, validation splits the users over the
processes and gives every one the same metrics, so all take the same early-stopping decision and keep the same best
weights; the first process alone writes the training state.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from recsys.data.prepared import EvalSplit, TrainingData
from recsys.errors import ConfigError, TrainingDiverged
from recsys.evaluation import EvalConfig, UserSample, evaluate
from recsys.models.family import Model
from recsys.modules.moe import expert_load
from recsys.runtime.budget import Budget, limit
from recsys.runtime.checkpoint import (
    is_distributed_checkpoint,
    keep_saved,
    load_distributed_checkpoint,
    save_distributed_checkpoint,
    saved_entries,
)
from recsys.runtime.device import apply_cpu_threads, resolve_device, use_bf16_autocast
from recsys.runtime.distributed import join, sum_over_workers
from recsys.runtime.progress import Progress, Then
from recsys.training.averaging import WeightAverage
from recsys.training.capabilities import TrainsPerDomain
from recsys.training.compilation import compile_model
from recsys.training.compile_cache import load_compile_cache, save_compile_cache
from recsys.training.config import TrainConfig
from recsys.training.data_parallel import DataParallelLoss, epoch_batches
from recsys.training.optimization import Optimization, build_optimization
from recsys.training.parallelism import choose_parallelism
from recsys.training.recipes import Recipe, recipe_for

logger = logging.getLogger(__name__)

EpochCallback = Callable[[int, dict[str, float]], None]
# `TrainConfig` settings that may change between attempts of one run: a saved state is resumed across them
RESUMABLE = frozenset(
    {
        "schedule.max_seconds",
        "schedule.patience",
        "hardware.max_memory_gb",
        "hardware.compile",
        "hardware.compile_mode",
        "hardware.compile_cache",
        "distributed.nproc_per_node",
        "distributed.shard_item_table",
        "progress",
    }
)


@dataclass
class FitResult:
    best_epoch: int
    best_valid: dict[str, float]
    train_seconds: float
    epoch_seconds: list[float] = field(default_factory=list)  # training part of each epoch
    valid_seconds: list[float] = field(default_factory=list)  # validation after each evaluated epoch
    # models with MoE layers: per validated epoch, the share of routed slots per expert in that epoch's training
    expert_load: list[dict[str, Any]] = field(default_factory=list)
    # this attempt's seconds from the start of `fit` to its first optimizer step and to the end of its first
    # validation after training began: what compiling (and loading a compile cache) costs before any progress
    first_step_seconds: float | None = None
    first_validation_seconds: float | None = None
    # the epoch whose mean loss was NaN or infinite, which ended the run with the best validated weights; None: none
    diverged_epoch: int | None = None

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
    model: Model[Any],
    data: TrainingData,
    config: TrainConfig,
    eval_config: EvalConfig,
    recipe: Recipe | None = None,
    on_epoch_end: EpochCallback | None = None,
    state_path: Path | None = None,
    compile_cache: Path | None = None,
) -> FitResult:
    """Train `model` in place, restore its best-on-validation weights, and report the run.

    Args:
        model: the model (moved to the configured device).
        data: prepared dataset, in memory (`SequenceData`) or read a shuffle buffer of parts at a time
            (`PreparedParts`); trains on `training_epoch()`, validates on `eval_split("valid")` (or on its seeded
            `train.valid_users` sample, then once on every user).
        config: optimisation and early-stopping settings.
        eval_config: how validation is ranked (ks, exclusion, batch size).
        recipe: batches and loss (`recsys.training.recipes.recipe_for`); None = the model family's defaults.
        on_epoch_end: called with (epoch, metrics) after every validated epoch, e.g. to log to MLflow.
        state_path: resumable training state, rewritten atomically after every validated epoch; when it
            exists and was written for the same model and settings, training resumes from it.
        compile_cache: with `train.hardware.compile`, the file of compiled artifacts loaded before the model
            compiles and (re)written after the first validation (`recsys.training.compile_cache`); None: none.
    """
    _check_monitor(config.schedule.monitor, eval_config)
    if recipe is None:
        recipe = recipe_for(model, data, config.optimization.batch_size)
    run = _TrainingRun(model, data, config, recipe, compile_cache)
    if state_path is not None:
        run.resume(state_path)

    def validated(epoch: int, loss: float | None) -> None:
        metrics = run.validate(epoch, loss, eval_config)
        if on_epoch_end is not None:
            on_epoch_end(epoch, metrics)
        if state_path is not None:
            run.save(state_path)

    if config.schedule.validate_initial and not run.result.valid_seconds:  # a resumed state was validated already
        validated(0, None)  # no training loss yet
    for epoch in run.epochs_left():
        loss = run.train_epoch(epoch)
        if not math.isfinite(loss):
            run.diverged(epoch, loss)
            if state_path is not None:
                run.save(state_path)  # final, as an early stop: a re-run keeps the best weights and trains nothing
            break
        if epoch % config.schedule.eval_every and epoch != config.schedule.epochs:
            continue
        validated(epoch, loss)
        if run.should_stop(epoch):
            break
    return run.finish(eval_config)


class _TrainingRun:
    """One model's training: what it needs to run an epoch, and what is saved to continue after a validated one."""

    def __init__(
        self, model: Model[Any], data: TrainingData, config: TrainConfig, recipe: Recipe, compile_cache: Path | None
    ) -> None:
        self.attempt_started = time.perf_counter()
        self.config, self.recipe, self.data = config, recipe, data
        self.compile_cache = compile_cache if config.hardware.compile else None
        hardware, optimization = config.hardware, config.optimization
        device = resolve_device(hardware.device)
        self.workers = join(device)
        self.device = self.workers.device(device)  # its own GPU, for one of several processes
        self.run_key = _run_key(model, data, config, recipe)  # before the move: the digest reads host memory
        self.parallelism = choose_parallelism(model, recipe, config, self.workers)
        self.model = self.parallelism.place(model, self.device)
        if self.device.type == "cpu":
            apply_cpu_threads(hardware.threads)
        self.use_bf16 = use_bf16_autocast(hardware.precision, self.device)
        logger.info("training on %s, bf16 autocast %s", self.device, self.use_bf16)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.loss = self.parallelism.loss(model, recipe, _may_skip_parameters(model, recipe))
        self.optimization = _optimization(model, data, config, recipe, self.device)
        self.average = WeightAverage(model, optimization.ema_decay) if optimization.ema_decay else None
        self.budget = _memory_budget(hardware.max_memory_gb)
        self.valid_sample, self.valid = _validation_users(data, config)
        self.epoch, self.early_stopped = 0, False
        self.batches_per_epoch: int | None = None  # counted as an epoch is trained (an epoch's share of each process)
        self.best_score = float("-inf")
        self.best_weights: dict[str, Any] | None = None
        self.result = FitResult(best_epoch=0, best_valid={}, train_seconds=0.0)
        self.started = time.perf_counter()

    @property
    def monitor(self) -> str:
        return self.config.schedule.monitor

    def epochs_left(self) -> Iterator[int]:
        """The epochs still to train (none after an early stop: it is final), compiling the model first if asked."""
        self.result.first_step_seconds = self.result.first_validation_seconds = None  # this attempt's (resumed: reset)
        self._compile()
        self.started = time.perf_counter() - self.result.train_seconds
        last = self.config.schedule.epochs
        first = last + 1 if self.early_stopped else self.epoch + 1
        yield from range(first, last + 1)

    def _compile(self) -> None:
        """`train.hardware.compile`: every later call of the model runs compiled (training rows, and validation's
        `score`); a recipe whose loss is device work alone trains through one graph of the loss and the forward."""
        mode = self.config.hardware.compile_mode
        if self.config.hardware.compile:
            if self.compile_cache is not None:
                load_compile_cache(self.compile_cache)
            with_loss = self.recipe.loss_compiles_with_model
            logger.info(
                "compiling the model's forward%s (mode %s; batch size and sequence length dynamic)",
                " and, for training, the recipe's loss with it" if with_loss else "", mode,
            )  # fmt: skip
            compile_model(self.model, mode)
            self.loss.compile(mode)
        elif mode != "default":
            logger.warning("train.hardware.compile_mode %r has no effect: train.hardware.compile is false", mode)

    def train_epoch(self, epoch: int) -> float:
        """One epoch of the recipe's batches; the epoch's wall time is recorded; returns the mean loss per target."""
        start = time.perf_counter()
        expert_load(self.model)  # count this epoch's routing only (validation routes examples too)
        batches = epoch_batches(self.data, self.recipe, self.generator, self.workers)  # this process's
        progress = Progress(
            logger, f"training epoch {epoch}/{self.config.schedule.epochs}", total=self.batches_per_epoch,
            unit="batches", rows_are="targets", bar=self.config.progress and self.workers.is_main,
            then=self._after(epoch),
        )  # fmt: skip
        loss = train_one_epoch(
            self.model, self.loss, batches, self.optimization, self.use_bf16,
            self.parallelism.loss_generator(self.generator, self.config.seed, epoch), self.average, self.budget,
            self.config.optimization.accumulate_batches, progress, self._first_step,
        )  # fmt: skip
        self.result.epoch_seconds.append(time.perf_counter() - start)
        self.batches_per_epoch = int(progress.done)  # the next epoch's total: the same rows, shuffled, packed anew
        return loss

    def _first_step(self) -> None:
        if self.result.first_step_seconds is None:
            self.result.first_step_seconds = time.perf_counter() - self.attempt_started
            logger.info("first training step after %.1f s", self.result.first_step_seconds)

    def _after(self, epoch: int) -> Then | None:
        """What follows `epoch`'s batches until the last epoch, at most (early stopping may end the run sooner), timed
        as the epochs and validations so far took; None before any epoch was timed."""
        if not self.result.epoch_seconds:
            return None
        schedule = self.config.schedule
        later = range(epoch, schedule.epochs + 1)
        validations = sum(1 for e in later if e % schedule.eval_every == 0 or e == schedule.epochs)
        seconds = (len(later) - 1) * self.result.seconds_per_epoch + validations * self.result.valid_seconds_per_epoch
        return Then("training", seconds, why="early stopping may end it sooner")

    def validate(self, epoch: int, loss: float | None, eval_config: EvalConfig) -> dict[str, float]:
        """Rank the validation split with the weights that would be kept (the EMA's with it on); keep them when the
        monitored metric improved. Returns the epoch's metrics (with the epoch's training `loss`; None: epoch 0,
        untrained)."""
        load = expert_load(self.model)  # this epoch's training batches
        self.model.eval()
        start = time.perf_counter()
        with self._averaged_weights():
            with self.parallelism.whole_tables(self.model):  # whole to rank every item; kept as trained, below
                ranked = evaluate(self.model, self.valid, self.data.num_items, eval_config, workers=self.workers,
                                  what=f"evaluation of validation, epoch {epoch}")  # fmt: skip
            metrics = {**({} if loss is None else {"loss": loss}), **ranked.metrics}
            improved = metrics[self.monitor] > self.best_score
            if improved:
                self.best_weights = copy.deepcopy(self.model.state_dict())
        self.result.valid_seconds.append(time.perf_counter() - start)
        if loss is not None and self.result.first_validation_seconds is None:  # both paths compiled by now
            self.result.first_validation_seconds = time.perf_counter() - self.attempt_started
            if self.compile_cache is not None and self.workers.is_main:
                save_compile_cache(self.compile_cache)
        metrics["epoch_seconds"] = self.result.epoch_seconds[-1] if self.result.epoch_seconds else 0.0  # 0: untrained
        if self.valid_sample is not None:
            metrics["valid_sample_users"] = float(len(ranked.ranks))
        if load is not None:
            metrics["expert_load_max_over_mean"] = float(load["max_over_mean"])  # type: ignore[arg-type]
            self.result.expert_load.append({"epoch": epoch, **load})
        trained = "untrained" if loss is None else f"loss {loss:.4f}"
        last = self.config.schedule.epochs
        logger.info("epoch %d/%d %s valid %s %.4f", epoch, last, trained, self.monitor, metrics[self.monitor])
        if improved:
            self.best_score, self.result.best_epoch = metrics[self.monitor], epoch
            self.result.best_valid = metrics
        self.epoch, self.result.train_seconds = epoch, time.perf_counter() - self.started
        self.early_stopped = epoch - self.result.best_epoch >= self.config.schedule.patience
        return metrics

    def _averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A block in which the model holds the weights validation ranks and keeps: the EMA's, with it on."""
        return contextlib.nullcontext() if self.average is None else self.average.applied()

    def diverged(self, epoch: int, loss: float) -> None:
        """`epoch`'s mean loss is NaN or infinite: the run ends with the best validated weights (as an early stop
        would; with `validate_initial`, the start's may be those), or fails when no validated epoch left finite
        weights to keep."""
        lr = self.config.optimization.lr
        fix = (
            f"lower train.optimization.lr (now {lr:g}), raise train.optimization.warmup_steps, or bound the steps with "
            "train.optimization.max_grad_norm (e.g. 1.0)"
        )
        finite = self.best_weights is not None and all(
            bool(torch.isfinite(t).all()) for t in self.best_weights.values() if t.is_floating_point()
        )
        if not finite:
            raise TrainingDiverged(
                f"training diverged: epoch {epoch}'s mean loss is {loss}, and no validated epoch left finite weights "
                f"to keep. Fix: {fix}"
            )
        logger.error(
            "training diverged: epoch %d's mean loss is %s; stopping with epoch %d's weights (valid %s %.4f). To train "
            "further, %s",
            epoch, loss, self.result.best_epoch, self.monitor, self.best_score, fix,
        )  # fmt: skip
        self.early_stopped, self.result.diverged_epoch = True, epoch

    def should_stop(self, epoch: int) -> bool:
        """After a validated epoch: stop early (patience spent) or at the time budget (a larger one resumes)."""
        if self.early_stopped:
            logger.info(
                "early stop at epoch %d: best %s %.4f at epoch %d",
                epoch, self.monitor, self.best_score, self.result.best_epoch,
            )  # fmt: skip
            return True
        budget = self.config.schedule.max_seconds
        spent = budget is not None and self.result.train_seconds > budget
        if sum_over_workers(torch.tensor([float(spent)])).item() > 0:  # every process stops if one is out of time
            logger.warning(
                "time budget of %.0f s spent after epoch %d; stopping (a larger budget resumes from here)",
                budget,
                epoch,
            )
            return True
        return False

    def finish(self, eval_config: EvalConfig) -> FitResult:
        """The best weights back in the model (eval mode), and the run's report: with a validation sample, the chosen
        checkpoint's metrics on every user."""
        self.result.train_seconds = time.perf_counter() - self.started
        if self.best_weights is not None:
            self.model.load_state_dict(self.best_weights)
        self.parallelism.unshard(self.model)  # the trained model is whole on every process: to evaluate, to write
        self.model.eval()
        if self.valid_sample is not None and self.result.best_valid:
            valid = self.data.eval_split("valid")
            what = f"evaluation of validation, epoch {self.result.best_epoch}, every user"
            full = evaluate(
                self.model, valid, self.data.num_items, eval_config, workers=self.workers, what=what
            ).metrics
            sampled = {k: v for k, v in self.result.best_valid.items() if k in full}
            logger.info("epoch %d on every user: valid %s %.4f (%.4f on the sample)", self.result.best_epoch,
                        self.monitor, full[self.monitor], sampled[self.monitor])  # fmt: skip
            kept = {k: v for k, v in self.result.best_valid.items() if k != "valid_sample_users"}  # loss, timings
            self.result.best_valid = {**kept, **full}
        return self.result

    def save(self, path: Path) -> None:
        """Everything needed to continue after this validated epoch, saved by every process together into the
        directory `path` (torch.distributed.checkpoint; replaced atomically), so it resumes on any number of them."""
        state = self._state(rng_of=self.workers.rank)
        if not self.workers.is_main:  # the run's progress is the first process's; the others only hold the same
            del state["progress"], state["generator"]
        save_distributed_checkpoint(path, state, self.workers)

    def resume(self, path: Path) -> None:
        """Continue from `path` when it belongs to this run; otherwise keep the fresh state (and say why)."""
        if not is_distributed_checkpoint(path):
            return
        progress = {"progress": ""}
        load_distributed_checkpoint(path, progress, self.workers)
        saved = json.loads(progress["progress"])
        if saved["run_key"] != self.run_key:
            logger.warning("%s was written for another model or settings; starting from epoch 1", path)
            return
        entries = saved_entries(path)
        if saved["has_best_weights"]:
            self.best_weights = copy.deepcopy(self.model.state_dict())  # the shapes to load them into
        own_rng = f"torch_rng_{self.workers.rank}" in entries  # not when resumed on more processes than saved it
        rng_of = self.workers.rank if own_rng else 0
        state = self._state(rng_of)
        state["optimization"] = keep_saved(state["optimization"], entries, "optimization")
        load_distributed_checkpoint(path, state, self.workers)
        self.model.load_state_dict(state["model"])
        self.optimization.load_state_dict(self.model, state["optimization"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state[f"torch_rng_{rng_of}"])
        if self.average is not None:
            self.average.load_state_dict(state["average"])
        self.parallelism.load_state(state)
        self.epoch, self.early_stopped = saved["epoch"], saved["early_stopped"]
        self.best_score, self.result = saved["best_score"], FitResult(**saved["result"])
        logger.info("resumed from %s after epoch %d (%.0f s trained)", path, self.epoch, self.result.train_seconds)

    def _state(self, rng_of: int) -> dict[str, Any]:
        """What `save` writes and `resume` loads into: tensors by name (weights, optimizer moments, generators) and
        the run's progress as one JSON string. The torch generator (dropout masks) is each process's own: saved under
        its rank, loaded as process `rng_of`'s."""
        progress = {
            "run_key": self.run_key, "epoch": self.epoch, "early_stopped": self.early_stopped,
            "best_score": self.best_score, "result": dataclasses.asdict(self.result),
            "has_best_weights": self.best_weights is not None,
        }  # fmt: skip
        state: dict[str, Any] = {
            "progress": json.dumps(progress),
            "model": self.model.state_dict(),
            "optimization": self.optimization.state_dict(self.model),
            "generator": self.generator.get_state(),
            f"torch_rng_{rng_of}": torch.get_rng_state(),
        }
        if self.best_weights is not None:
            state["best_weights"] = self.best_weights
        if self.average is not None:
            state["average"] = self.average.state_dict()
        return {**state, **self.parallelism.state()}  # e.g. the fused optimizer's state of tables sharded by DMP


def _run_key(model: Model[Any], data: TrainingData, config: TrainConfig, recipe: Recipe) -> str:
    """What must match for a saved state to be resumed: the inputs (the data and what the model holds without
    training it), the model's settings, the recipe's and the optimisation's. So new data of the same shape (the next
    day's) or a retrained first stage under a ranker trains afresh rather than resuming a finished run.

    The time budget, patience, progress bar, compilation, memory bound and processes (`RESUMABLE`) may change between
    attempts, and so may the epoch count under a constant learning rate (a cosine schedule is planned over it, so
    there it must not).
    """
    settings = dataclasses.asdict(config)
    for dotted in RESUMABLE | ({"schedule.epochs"} if config.optimization.lr_schedule == "constant" else set()):
        *groups, name = dotted.split(".")
        tree = settings
        for group in groups:
            tree = tree[group]
        del tree[name]
    model_key = f"{type(model).__name__}|{model.config!r}"
    return f"{_inputs_digest(model, data, recipe)}|{model_key}|{settings!r}|{_recipe_key(recipe)}"


def _inputs_digest(model: Model[Any], data: TrainingData, recipe: Recipe) -> str:
    """A digest of what the run learns from: the data (`TrainingData.fingerprint`), the tensors the model holds
    but does not train (a frozen first stage or base model, semantic IDs, content embeddings), taken before training
    moves any buffer, the models the recipe reads (a ranker's held-out first stage) and what else it reads that
    fingerprints itself (a teacher's top-K cache)."""
    tensors: list[torch.Tensor] = [p for _, p in sorted(model.named_parameters()) if not p.requires_grad]
    tensors += [b for _, b in sorted(model.named_buffers())]
    digest = hashlib.blake2b(digest_size=16)
    data.fingerprint(digest)
    for value in _fields(recipe).values():
        if isinstance(value, nn.Module):
            tensors += [t for _, t in sorted(value.state_dict().items())]
        elif isinstance(value, Fingerprinted):
            value.fingerprint(digest)
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _recipe_key(recipe: Recipe) -> str:
    """The recipe's settings, and those of the recipe it extends (a distillation's next-item one), without its
    tensors (derived from the data) or models (`_inputs_digest` has them)."""
    plain = (bool, int, float, str, type(None), tuple, dict)
    fields = _fields(recipe)
    settings = {name: value for name, value in fields.items() if isinstance(value, plain)}
    extended = {name: _recipe_key(value) for name, value in fields.items() if isinstance(value, Recipe)}
    return f"{type(recipe).__name__}{settings | extended!r}"


@runtime_checkable
class Fingerprinted(Protocol):
    def fingerprint(self, digest: Any) -> None:
        """Feed what it is made of into `digest` (a hashlib object)."""
        ...


def _fields(recipe: Recipe) -> dict[str, Any]:
    """A recipe's fields by name (recipes are dataclasses)."""
    assert dataclasses.is_dataclass(recipe) and not isinstance(recipe, type), f"{type(recipe).__name__}: a dataclass"
    return {f.name: getattr(recipe, f.name) for f in dataclasses.fields(recipe)}


def train_one_epoch(
    model: nn.Module,
    loss_of: DataParallelLoss,
    batches: Iterable[Any],
    optimization: Optimization,
    use_bf16: bool,
    generator: torch.Generator,
    average: WeightAverage | None = None,
    budget: Budget | None = None,
    accumulate: int = 1,
    progress: Progress | None = None,
    on_update: Callable[[], None] | None = None,
) -> float:
    """One pass over `batches` (an optimizer and scheduler step, and `average` update, every `accumulate` batches and
    after the last), its `progress` reported (batches, targets/s) and `budget` checked after every batch; returns the
    mean loss per target (over every process's). `progress` None: lines of "training epoch" without a total;
    `on_update` is called after every optimizer step."""
    model.train()
    device = next(model.parameters()).device
    total, count = torch.zeros((), device=device), 0  # summed on the device: no host sync per step
    guard = (budget or Budget("training")).start()
    progress = progress or Progress(logger, "training epoch", total=None, unit="batches", rows_are="targets")
    optimization.zero_grad()
    for step, (batch, last) in enumerate(_marking_the_last(batches), start=1):
        updates = last or step % accumulate == 0
        torch.compiler.cudagraph_mark_step_begin()  # compile modes that replay CUDA graphs: a new iteration begins
        # between updates, the processes of a distributed run keep their gradients to themselves (DDP's no_sync)
        with contextlib.nullcontext() if updates else loss_of.no_sync():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss, summed, n = loss_of(batch.to(device), generator)
            (loss / accumulate if accumulate > 1 else loss).backward()
        if updates:
            optimization.step()
            optimization.zero_grad()
            if average is not None:
                average.update()
            if on_update is not None:
                on_update()
        total += summed
        count += n
        progress.update(done=step, rows=n)
        guard.check(f"after {step:,} steps of the epoch")
    progress.finish()
    loss_of.check()
    everyone = sum_over_workers(torch.stack([total, torch.tensor(float(count), device=device)]))
    return float(everyone[0]) / max(float(everyone[1]), 1.0)


def _marking_the_last(items: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """(item, whether it is the last) for each of `items`, looking one ahead."""
    iterator = iter(items)
    previous = next(iterator, _END)
    for item in iterator:
        yield previous, False
        previous = item
    if previous is not _END:
        yield previous, True


_END = object()


def _may_skip_parameters(model: Model[Any], recipe: Recipe) -> bool:
    """Whether a step may leave some parameters out of its loss: the recipe's say (a ranker's experts), or a model
    trained one domain at a time (a domain's adapter trains alone; the other domains' parameters sit its steps out)."""
    return recipe.may_skip_parameters or isinstance(model, TrainsPerDomain)


def _optimization(
    model: Model[Any], data: TrainingData, config: TrainConfig, recipe: Recipe, device: torch.device
) -> Optimization:
    """The optimizers and learning-rate schedule of `config.optimization`, over the parameters the run's optimizer
    updates (built after the loss: the tables DMP shards are updated in the backward pass, and left out here)."""
    optimization = config.optimization
    # the cosine schedule needs the epoch length: count one epoch's batches (a throw-away shuffle)
    batches_per_epoch = _batches_per_epoch(data, recipe) if optimization.lr_schedule == "cosine" else 0
    steps_per_epoch = -(-batches_per_epoch // optimization.accumulate_batches)  # optimizer steps
    return build_optimization(
        model, lr=optimization.lr, weight_decay=optimization.weight_decay, schedule=optimization.lr_schedule,
        warmup_steps=optimization.warmup_steps, total_steps=config.schedule.epochs * steps_per_epoch,
        fused=device.type == "cuda",  # one kernel for the whole update instead of several per parameter
        max_grad_norm=optimization.max_grad_norm,
    )  # fmt: skip


def _memory_budget(max_memory_gb: float | None) -> Budget:
    """The bound on the memory training adds (`train.hardware.max_memory_gb`), checked after every batch."""
    shrink = "lower train.optimization.batch_size (or train.stream_parts, for a partitioned dataset)"
    return Budget("training", memory_gb=limit(max_memory_gb, "train.hardware.max_memory_gb", shrink))


def _validation_users(data: TrainingData, config: TrainConfig) -> tuple[UserSample | None, EvalSplit]:
    """The users each epoch is validated on: every one, or the seeded sample `train.schedule.valid_users` (then the
    chosen checkpoint is validated on every user at the end)."""
    valid_users = config.schedule.valid_users
    if valid_users is None:
        return None, data.eval_split("valid")
    sample = UserSample(valid_users, config.seed)
    # only the sampled users are read: a partitioned dataset is not loaded whole for it
    valid = data.select_users(sample.rows(data.num_users)).eval_split("valid")
    logger.info("validating each epoch on %d of %d users (seed %d); the chosen checkpoint on all of them",
                len(valid.targets), data.num_users, config.seed)  # fmt: skip
    return sample, valid


def _batches_per_epoch(data: TrainingData, recipe: Recipe) -> int:
    """How many batches an epoch has (packing them once with a throw-away generator)."""
    generator = torch.Generator()
    return sum(len(recipe.batches(rows, generator)) for rows in data.training_epoch(generator))


def _check_monitor(monitor: str, eval_config: EvalConfig) -> None:
    """Fail before training, not after the first epoch, when the monitored metric will not exist."""
    valid = {"mrr", *(f"{m}@{k}" for m in ("recall", "ndcg", "coverage") for k in eval_config.ks)}
    if monitor not in valid:
        raise ConfigError(
            f"train.schedule.monitor {monitor!r} is not computed. Fix: use one of {', '.join(sorted(valid))} "
            "(eval.ks sets k)"
        )
