"""How any model trains (an experiment's `train` section), grouped by what each setting is about; what only one model
family reads is its `model.training` (`recsys.training.recipes`).

    train:
      seed: 0
      schedule:      {epochs, patience, monitor, eval_every, valid_users, max_seconds,  when it stops, how it validates
                      validate_initial}
      optimization:  {batch_size, accumulate_batches, lr, lr_schedule, warmup_steps, weight_decay, ema_decay,
                      max_grad_norm}
      hardware:      {device, precision, threads, compile, compile_mode, max_memory_gb}  where and how fast it runs
      distributed:   {nproc_per_node, shard_item_table}                                   several processes
      stream_parts:  null                                                                 how the rows are read
      progress:      true
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from recsys.runtime.validation import Fraction

# torch.compile's `mode` (`recsys.training.compilation`): "max-autotune" tunes matmul kernels (a longer compile);
# "reduce-overhead" and "max-autotune" replay CUDA graphs (recorded once per input shape), "max-autotune-no-cudagraphs"
# does not. Here, so that reading a config imports no compiler (nor Triton, which must see TRITON_INTERPRET first)
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


@dataclass(frozen=True)
class ScheduleConfig:
    """When training stops, and how it is validated (checkpoints are chosen on validation only)."""

    epochs: PositiveInt = 200
    patience: PositiveInt = 10  # epochs without a better validation metric before stopping
    monitor: str = "ndcg@10"  # validation metric that picks the checkpoint
    eval_every: PositiveInt = 1
    # validate each epoch on a seeded sample of this many users (a large catalogue's full pass costs as much as
    # training); the chosen checkpoint is then validated once on every user, and that is the run's valid metric.
    # None = every user every epoch
    valid_users: PositiveInt | None = None
    max_seconds: NonNegativeFloat | None = None  # stop after the first validated epoch past this wall time
    # validate the weights before any training, as epoch 0: a model that starts as a baseline (a residual ranker
    # starts as its retriever's order) is then kept as it is unless an epoch beats it on validation
    validate_initial: bool = False


@dataclass(frozen=True)
class OptimizationConfig:
    """The optimizer's steps."""

    # next-item models: packed rows of their window (Beauty: ~40 targets each); others: (history, next item) pairs
    batch_size: PositiveInt = 16
    # optimizer step every this many batches, on the mean of their losses (each counts 1/K; an epoch's last, shorter
    # group too): the update of K times the batch in the memory of one
    accumulate_batches: PositiveInt = 1
    lr: PositiveFloat = 1e-3
    # "cosine": linear warm-up over `warmup_steps`, then cosine decay to 0 at the last planned epoch;
    # "constant": `lr` throughout (after the warm-up, if any).
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: NonNegativeInt = 0
    weight_decay: NonNegativeFloat = 0.0
    # > 0: validate, checkpoint and save an exponential moving average of the weights (decay per step, e.g.
    # 0.999 averages over ~1,000 steps) instead of the last step's weights; 0 = off
    ema_decay: Fraction = 0.0
    # the dense parameters' gradients scaled to this total L2 norm at most before each step (e.g. 1.0, against a run
    # that diverges); None = not clipped. Item tables updated outside Adam (row-sparse, sharded) are not clipped
    max_grad_norm: PositiveFloat | None = None


@dataclass(frozen=True)
class HardwareConfig:
    """Where training runs and how fast; none of it changes what is learned beyond floating-point rounding."""

    device: str = "auto"  # "auto" = cuda when available, else cpu
    # "auto": bf16 autocast on CUDA and on CPUs with native bf16 matmuls (the AVX512-BF16 / AMX flags), else fp32.
    # Embedding tables, optimizer state and the softmax stay fp32 either way.
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    threads: PositiveInt | None = None  # CPU training: torch threads; None = torch's default (one per core)
    # torch.compile the model's forward, batch and sequence length dynamic (`recsys.training.compilation`): fewer
    # kernel launches; the first epoch and the first validation pay the compiling
    compile: bool = False
    compile_mode: CompileMode = "default"  # torch.compile's `mode`, with `compile: true`
    # with `compile: true`, keep what was compiled beside the model directory and load it in a re-run of the same
    # model (a retrain, a resumed or longer run): its first step waits for tracing, not for kernels to be generated
    compile_cache: bool = True
    # the training process's resident memory (GiB), checked every step: past it, training stops with an error that
    # names this knob (the last validated epoch's state stays resumable) instead of the kernel's OOM kill
    max_memory_gb: PositiveFloat | None = None


@dataclass(frozen=True)
class DistributedConfig:
    """Training on several processes (docs/distributed.md)."""

    # processes that train data parallel on this host (`recsys train` starts them through torch's elastic launcher:
    # one per GPU, or CPU processes under gloo); under torchrun, the launcher's WORLD_SIZE decides instead
    nproc_per_node: PositiveInt = 1
    # SASRec / HSTU on several processes: split the item table's rows over them (weights, gradients, Adam moments:
    # V/N rows each) instead of a copy on each, for a catalogue whose table does not fit one device; needs the
    # sampled softmax (`recsys.training.row_sharding`)
    shard_item_table: bool = False
    # a replicated item table that the sampled softmax reads by ids: its gradient is averaged by the rows a step
    # touched while the rows gathered from every process are at most this share of the table, else all-reduced whole
    # (`recsys.training.row_sparse_reduction`: about where the two costs measured on 2 GPUs cross); 0 = always whole,
    # the number of processes = always by rows
    row_sparse_below: NonNegativeFloat = 0.3


@dataclass(frozen=True)
class TrainConfig:
    """An experiment's `train` section (module docstring)."""

    seed: int = 0
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    # next-item models: training reads the prepared parts this many at a time (its shuffle buffer) instead of every
    # sequence at once (`recsys.data.prepared.PreparedParts`); None = all in memory. Evaluation reads the data whole.
    stream_parts: PositiveInt | None = None
    progress: bool = True
