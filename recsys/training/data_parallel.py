"""Data-parallel training steps: every process takes its share of each batch, DistributedDataParallel averages the
gradients, and the update is the one a single process makes on the whole batch.

Where a process's share comes from (`epoch_batches`): packed next-item batches (`NextItemRecipe`) are packed apart,
each process reading and packing its own part of every shuffle buffer (its parts of a partitioned dataset, else every
N-th user) into batches of rows_per_batch / N rows: no process reads or packs what another trains on. Other recipes'
batches are packed whole by every process (the same data, the same seeded generator), which trains on rows rank,
rank + world_size, ... of each (`share_of_rows`).

A share's loss is the mean over its own targets, and shares hold different numbers of targets (packed rows, pairs
the first stage missed), while DDP averages the processes' gradients with equal weights. So each process scales its
loss by its share of the batch's targets (n_rank * world_size / n_batch): the averaged gradient is then the gradient
of the mean over all the batch's targets, as in one process. What still differs from one process: the order of
float sums, dropout masks (drawn per process), in-batch negatives (each process sees its share's), and, for batches
packed apart, which users' runs share a batch (each process packs from its own users).

The recipe's loss calls model methods other than `forward` (`encode_queries`, `item_embeddings`, ...), which DDP's
hooks do not see; `LossModule` makes the whole loss one module's forward, so DDP tracks every parameter it reads.
Two tables stay out of DDP: one split by rows (each block's gradient is its process's already), and an ID table the
sampled softmax reads only at the step's ids, averaged by the rows each update touched (`RowSparseReduction`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from recsys.data.batching import PackedBatch
from recsys.data.prepared import PreparedParts, TrainingData, TrainingRows
from recsys.errors import ConfigError
from recsys.runtime.distributed import Workers, backend_for, reduce_on_hosts
from recsys.training.capabilities import ItemIdTable
from recsys.training.compilation import compile_model
from recsys.training.config import CompileMode
from recsys.training.recipes import Recipe
from recsys.training.recipes.next_item import NextItemRecipe
from recsys.training.row_sparse_reduction import RowSparseReduction


class LossModule(nn.Module):
    """`recipe.loss(model, batch, generator)` as the forward of one module that holds the model."""

    def __init__(self, model: nn.Module, recipe: Recipe) -> None:
        super().__init__()
        self.model = model
        self.recipe = recipe

    def forward(self, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        return self.recipe.loss(self.model, batch, generator)


@dataclasses.dataclass(frozen=True)
class Share:
    """A batch packed by this process for itself (`epoch_batches`): its share of the step's batch as it is.

    Args:
        batch: the rows this process trains on.
        has_rows: False for a step the other processes have rows for and this one has not (its packing ran out
            first): it runs `batch` (rows of an earlier step) weighted 0, since every process must run the step.
    """

    batch: Any
    has_rows: bool = True

    def to(self, device: torch.device | str) -> Share:
        return Share(self.batch.to(device), self.has_rows)


def epoch_batches(
    data: TrainingData, recipe: Recipe, generator: torch.Generator, workers: Workers,
    seconds: dict[str, float] | None = None,
) -> Iterator[Any]:  # fmt: skip
    """One epoch's batches as this process trains on them.

    One process, or a recipe other than the packed next-item one: the recipe's batches of every shuffle buffer
    (`data.training_epoch`), which several processes each pack whole and split by rows (`DataParallelLoss`).
    Packed next-item batches on several processes: `Share`s this process reads and packs alone (`_packed_apart`).

    Args:
        data: the training data.
        recipe: its batches and loss.
        generator: the data's generator (the same on every process: the epoch's order of parts).
        workers: the run's processes.
        seconds: when given, the seconds spent reading ("read") and packing ("pack") are added to it.
    """
    if workers.distributed and type(recipe) is NextItemRecipe and not recipe.index_targets:
        yield from _packed_apart(data, recipe, generator, workers, seconds if seconds is not None else {})
        return
    pieces = data.training_epoch(generator)
    while True:
        start = time.perf_counter()
        rows = next(pieces, None)
        _add(seconds, "read", start)
        if rows is None:
            return
        start = time.perf_counter()
        batches = recipe.batches(rows, generator)
        _add(seconds, "pack", start)
        yield from batches


def _add(seconds: dict[str, float] | None, key: str, start: float) -> None:
    if seconds is not None:
        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start


def _packed_apart(
    data: TrainingData, recipe: NextItemRecipe, generator: torch.Generator, workers: Workers,
    seconds: dict[str, float],
) -> Iterator[Share]:  # fmt: skip
    """Every shuffle buffer's users split over the processes, each packing its own into batches of
    rows_per_batch / N rows. A buffer of at least N parts is split by parts (each process reads only its own, every
    N-th of the buffer's), a smaller one (or data in memory) by users (every N-th). The buffers' order comes from
    `generator` as `data.training_epoch` draws it, and one number drawn from it per buffer seeds the packing (with the
    rank): the data's generator advances alike on every process, whatever each packed. The processes then agree on
    the buffer's steps (the most batches any packed; on the hosts); one with fewer runs its last batch again
    weighted 0 (`Share.has_rows`)."""
    share = dataclasses.replace(recipe, rows_per_batch=-(-recipe.rows_per_batch // workers.world_size))
    last: Any = None
    for rows in _rows_apart(data, generator, workers, seconds):
        packing = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=generator)) + workers.rank)
        start = time.perf_counter()
        batches = share.batches(rows, packing) if rows is not None else []
        _add(seconds, "pack", start)
        (steps,) = reduce_on_hosts([len(batches)], "max")
        for step in range(steps):
            if step < len(batches):
                last = batches[step]
                yield Share(last)
            else:
                if last is None:
                    raise RuntimeError(
                        f"process {workers.rank} has no training rows to run a step on: the data's first shuffle "
                        f"buffer holds fewer users than the {workers.world_size} processes. Fix: more users per "
                        "buffer (train.stream_parts), or fewer processes"
                    )
                yield Share(last, has_rows=False)


def _rows_apart(
    data: TrainingData, generator: torch.Generator, workers: Workers, seconds: dict[str, float]
) -> Iterator[TrainingRows | None]:
    """This process's training rows of each shuffle buffer of the epoch (None: none in this buffer)."""
    n, rank = workers.world_size, workers.rank
    if isinstance(data, PreparedParts):
        order = torch.randperm(len(data.files), generator=generator)  # as PreparedParts.training_epoch draws it
        for buffer in torch.split(order, data.buffer_parts):
            start = time.perf_counter()
            rows: TrainingRows | None
            if len(buffer) >= n:  # by parts: this process reads its own only
                rows = data.read([data.files[i] for i in buffer[rank::n].tolist()]).training_rows()
            else:
                rows = _every_nth_user(data.read([data.files[i] for i in buffer.tolist()]).training_rows(), workers)
            _add(seconds, "read", start)
            yield rows
        return
    for whole in data.training_epoch(generator):
        yield _every_nth_user(whole, workers)


def _every_nth_user(rows: TrainingRows, workers: Workers) -> TrainingRows | None:
    users = torch.arange(workers.rank, len(rows.items), workers.world_size)
    if len(users) == 0:
        return None
    return TrainingRows(
        rows.items.select(users), rows.timestamps.select(users),
        {task: labels.select(users) for task, labels in rows.labels.items()},
    )  # fmt: skip


def share_of_rows(batch: Any, workers: Workers) -> tuple[Any, bool]:
    """This process's rows of `batch` (a dataclass of tensors with the rows first): rank, rank + world_size, ....

    Returns:
        (the share, whether it holds rows): a batch with fewer rows than processes leaves some without any; they
        take its first row and weigh it 0, since every process must run the step for DDP's reduction.
    """
    rows = _rows(batch)
    if workers.rank >= rows:
        return _take(batch, slice(0, 1)), False
    return _take(batch, slice(workers.rank, None, workers.world_size)), True


def _rows(batch: Any) -> int:
    return next(len(value) for value in _tensors(batch).values())


def _tensors(batch: Any) -> dict[str, torch.Tensor]:
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None}


def _take(batch: Any, rows: slice) -> Any:
    if isinstance(batch, PackedBatch):  # it has a field that is not rows-first
        return batch.take_rows(rows)
    return dataclasses.replace(batch, **{name: value[rows] for name, value in _tensors(batch).items()})


class DataParallelLoss:
    """The loss of one training step, for `loss.backward()`: on one process the recipe's loss of the whole batch; on
    several, this process's share of it, weighted so that DDP's average is the whole batch's mean.

    Args:
        model: the model being trained (already on this process's device).
        recipe: its batches and loss.
        workers: the run's processes.
        find_unused_parameters: some steps leave parameters out of the loss (a ranker's MoE experts, or a batch
            whose targets the first stage missed); DDP must then look for them after each forward.
        row_sparse_below: `train.distributed.row_sparse_below` (`RowSparseReduction`'s `dense_above`).
    """

    row_sparse: RowSparseReduction | None = None  # the item table's average by touched rows, where it applies

    def __init__(
        self,
        model: nn.Module,
        recipe: Recipe,
        workers: Workers,
        find_unused_parameters: bool,
        row_sparse_below: float = 0.3,
    ) -> None:
        self.workers = workers
        self.recipe = recipe
        self.loss_module = LossModule(model, recipe)
        self.module: nn.Module = self.loss_module
        if workers.distributed:
            device = next(model.parameters()).device
            if backend_for(device) == "nccl" and any(_sparse(m) for m in model.modules()):
                raise ConfigError(
                    "row-sparse item gradients (model.training.sparse_item_gradients) cannot be averaged over GPUs: "
                    "NCCL has no sparse all-reduce. Fix: set it to false (a GPU's dense Adam over the table is cheap, "
                    "docs/scale.md), or train on CPU processes (gloo)"
                )
            # a table sharded by rows over the processes has each block's whole gradient on its process already; an
            # item table the sampled softmax reads by ids is averaged by the rows a step touched (RowSparseReduction)
            table = _table_read_by_ids(model, recipe)
            apart = [f"model.{name}" for name, p in model.named_parameters() if isinstance(p, DTensor) or p is table]
            if table is not None:
                self.row_sparse = RowSparseReduction(table, workers, self._syncing, dense_above=row_sparse_below)
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.module, apart)
            # gradients as views of the all-reduce buckets: no copy back from the bucket after each all-reduce, and
            # no second copy of every gradient held
            self.module = DistributedDataParallel(
                self.module,
                device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=find_unused_parameters,
                gradient_as_bucket_view=True,
            )

    def compile(self, mode: CompileMode, backend: str | Callable[..., Any] = "inductor") -> None:
        """For a recipe whose loss is device work alone (`Recipe.loss_compiles_with_model`), compile the loss with the
        model's forward into one graph: the loss's kernels fused and, in the modes that replay CUDA graphs, replayed
        with the forward's rather than each launched by the host; other recipes' losses stay eager. In place, so DDP
        (which wraps this module) runs it compiled."""
        if self.recipe.loss_compiles_with_model:
            compile_model(self.loss_module, mode, backend)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """A block whose backward passes keep their gradients on this process (accumulated until a synced one)."""
        if isinstance(self.module, DistributedDataParallel):
            return self.module.no_sync()
        return contextlib.nullcontext()

    def _syncing(self) -> bool:
        """Whether the backward pass now running ends an update (DDP's flag, False inside `no_sync`)."""
        return bool(getattr(self.module, "require_backward_grad_sync", True))

    def check(self) -> None:
        """At the end of an epoch: raise if the epoch's updates went wrong in a way only the device knew (reads it)."""
        if self.row_sparse is not None:
            self.row_sparse.check()

    def __call__(self, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(the loss to differentiate, this process's summed loss over its targets (detached), its targets)."""
        if not self.workers.distributed:
            loss, n = self.module(batch, generator)
            return loss, loss.detach().float() * n, n
        share, has_rows = (
            (batch.batch, batch.has_rows) if isinstance(batch, Share) else share_of_rows(batch, self.workers)
        )
        loss, n = self.module(share, generator)
        n = n if has_rows else 0
        # the processes' target counts (and the item rows their backward passes may touch) are integers on their
        # hosts: exchanged there (gloo), never read back from a GPU, so the host goes on queueing the backward pass
        # while the GPU still runs the forward. One maximum gives both: each process's count in its own slot (the
        # others 0), then the most rows any one read
        slots = [0] * self.workers.world_size
        slots[self.workers.rank] = n
        read = _rows_read(share, self.recipe) if self.row_sparse is not None else 0
        *counts, rows = reduce_on_hosts([*slots, read], "max")
        if self.row_sparse is not None:
            self.row_sparse.expect(rows)
        weight = n * self.workers.world_size / max(sum(counts), 1)
        return loss * weight, loss.detach().float() * n, n


def _table_read_by_ids(model: nn.Module, recipe: Recipe) -> torch.Tensor | None:
    """The item table whose gradient `RowSparseReduction` averages: a plain ID table (not split by rows, not row-sparse)
    that the packed next-item loss reads only at the step's ids (inputs, targets, sampled negatives); else None."""
    if type(recipe) is not NextItemRecipe or recipe.sampler is None or not isinstance(model, ItemIdTable):
        return None
    table = model.item_id_table()
    if table is None or table.sparse or isinstance(table.weight, DTensor):
        return None
    return table.weight


def _rows_read(batch: Any, recipe: Recipe) -> int:
    """At most how many item rows one backward pass of `batch` touches: its input and target ids and the sampled
    negatives (the padding row among them)."""
    assert isinstance(batch, PackedBatch) and isinstance(recipe, NextItemRecipe)
    return batch.inputs.numel() + batch.targets.numel() + recipe.num_negatives + 1


def _sparse(module: nn.Module) -> bool:
    """Whether `module` is an embedding table whose gradient is row-sparse."""
    return isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.sparse
