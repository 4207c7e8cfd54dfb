"""Data-parallel training steps: every process takes its share of each batch, DistributedDataParallel averages the
gradients, and the update is the one a single process makes on the whole batch.

Every process packs the same batches (the same data, the same seeded generator), then trains on rows rank,
rank + world_size, ... of each. A share's loss is the mean over its own targets, and shares hold different numbers
of targets (packed rows, pairs the first stage missed), while DDP averages the processes' gradients with equal
weights. So each process scales its loss by its share of the batch's targets (n_rank * world_size / n_batch): the
averaged gradient is then the gradient of the mean over all the batch's targets, as in one process. What still
differs from one process: the order of float sums, dropout masks (drawn per process), and in-batch negatives
(each process sees its share's).

The recipe's loss calls model methods other than `forward` (`encode_queries`, `item_embeddings`, ...), which DDP's
hooks do not see; `LossModule` makes the whole loss one module's forward, so DDP tracks every parameter it reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from recsys.errors import ConfigError
from recsys.runtime.distributed import Workers, backend_for, reduce_on_hosts
from recsys.training.recipes import Recipe


class LossModule(nn.Module):
    """`recipe.loss(model, batch, generator)` as the forward of one module that holds the model."""

    def __init__(self, model: nn.Module, recipe: Recipe) -> None:
        super().__init__()
        self.model = model
        self.recipe = recipe

    def forward(self, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        return self.recipe.loss(self.model, batch, generator)


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
    """

    def __init__(self, model: nn.Module, recipe: Recipe, workers: Workers, find_unused_parameters: bool) -> None:
        self.workers = workers
        self.module: nn.Module = LossModule(model, recipe)
        if workers.distributed:
            device = next(model.parameters()).device
            if backend_for(device) == "nccl" and any(_sparse(m) for m in model.modules()):
                raise ConfigError(
                    "row-sparse item gradients (model.training.sparse_item_gradients) cannot be averaged over GPUs: "
                    "NCCL has no sparse all-reduce. Fix: set it to false (a GPU's dense Adam over the table is cheap, "
                    "docs/scale.md), or train on CPU processes (gloo)"
                )
            # a table sharded by rows over the processes has each block's whole gradient on its process already
            sharded = [f"model.{name}" for name, p in model.named_parameters() if isinstance(p, DTensor)]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.module, sharded)
            self.module = DistributedDataParallel(
                self.module,
                device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=find_unused_parameters,
            )

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """A block whose backward passes keep their gradients on this process (accumulated until a synced one)."""
        if isinstance(self.module, DistributedDataParallel):
            return self.module.no_sync()
        return contextlib.nullcontext()

    def __call__(self, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(the loss to differentiate, this process's summed loss over its targets (detached), its targets)."""
        if not self.workers.distributed:
            loss, n = self.module(batch, generator)
            return loss, loss.detach().float() * n, n
        share, has_rows = share_of_rows(batch, self.workers)
        loss, n = self.module(share, generator)
        n = n if has_rows else 0
        # the processes' target counts are integers on their hosts: summed there (gloo), never read back from a GPU,
        # so the host goes on queueing the backward pass while the GPU still runs the forward
        (everyone,) = reduce_on_hosts([n])
        weight = n * self.workers.world_size / max(everyone, 1)
        return loss * weight, loss.detach().float() * n, n


def _sparse(module: nn.Module) -> bool:
    """Whether `module` is an embedding table whose gradient is row-sparse."""
    return isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.sparse
