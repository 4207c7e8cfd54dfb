"""An item table sharded by rows over the run's processes (`train.shard_item_table`), through PyTorch's tensor
parallelism: the table's weight becomes a DTensor whose rows are split in contiguous blocks, one per process, and
its lookups go through `RowwiseParallel`.

Each process looks up its own ids (its share of the batch: its histories, targets and drawn negatives). The lookup
gathers every process's ids, each process reads the rows it holds (zeros elsewhere), and a reduce-scatter returns
to each process the sum for its own ids: the vectors, as torchrec's row-wise sharding does. Processes may look up
different numbers of ids; they are padded with the padding row to the largest count, which the processes agree on
first (one small all-reduce), since the collectives need equal blocks. The backward pass runs the same way in
reverse, so the gradient of a block is complete on the process that holds it and is never all-reduced: DDP skips
the table. That gradient sums every process's weighted loss (`recsys.training.data_parallel`), where DDP averages
the other parameters' gradients, so each lookup's gradient is divided by the process count.

A table of V rows and D columns then costs each of N processes V/N rows of weights, gradients and Adam moments
instead of V. What still reads the whole table (evaluation, the trained model written at the end) gathers it
(`gathered_item_table`, `unshard_item_table`). The lookups are row reads, so the loss must read rows too: the
sampled softmax, not the full one (whose logits against every item would need a vocabulary-parallel softmax).

Dimension letters: V+1 rows, D dim, N processes, n ids looked up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

from recsys.errors import ConfigError
from recsys.runtime.distributed import Workers
from recsys.training.capabilities import ItemIdTable, item_id_table
from recsys.training.recipes import Recipe
from recsys.training.recipes.next_item import NextItemRecipe

logger = logging.getLogger(__name__)


def check_shardable(model: nn.Module, recipe: Recipe) -> None:
    """Raise a ConfigError when `model`'s item table cannot be sharded by rows in training by `recipe`."""
    table = item_id_table(model)
    fix = "Fix: set train.distributed.shard_item_table to false"
    if table is None:
        raise ConfigError(
            f"train.distributed.shard_item_table shards an item-id table, which {type(model).__name__} with these "
            f"settings does not have (SASRec and HSTU have one unless they read semantic IDs). {fix}"
        )
    if table.sparse:
        raise ConfigError(
            "train.distributed.shard_item_table with model.training.sparse_item_gradients: a sharded table's "
            f"gradient is dense per process (V/N rows). {fix}, or sparse_item_gradients to false"
        )
    if not isinstance(recipe, NextItemRecipe) or recipe.sampling_probs is None:
        raise ConfigError(
            "train.distributed.shard_item_table with the full softmax: a sharded table is read row by row, and the "
            f"full softmax scores every item each step. {fix}, or model.training.loss to sampled_softmax"
        )


def shard_item_table(model: nn.Module, workers: Workers, device: torch.device) -> None:
    """Split `model`'s item table by rows over the run's processes, in place; the rest of the model is untouched.

    Called while the model is on the host: each process moves only its own block to `device`.
    """
    table = item_id_table(model)
    assert table is not None  # check_shardable said so
    mesh = init_device_mesh(device.type, (workers.world_size,))
    full = table.weight.detach()
    rows = -(-full.shape[0] // workers.world_size)  # DTensor's Shard(0) splits as torch.chunk: blocks of ceil(V+1 / N)
    block = full[workers.rank * rows : (workers.rank + 1) * rows]  # the last blocks may be shorter, or empty
    local = torch.empty_like(block, device=device).copy_(block)
    sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride())
    table.weight = nn.Parameter(sharded, requires_grad=table.weight.requires_grad)
    parallelize_module(table, mesh, RowwiseParallel(input_layouts=Shard(0), output_layouts=Shard(0)))
    _pad_lookups_to_equal_blocks(table, workers.world_size)
    logger.info(
        "item table sharded by rows: %d rows of %d on each of %d processes",
        local.shape[0], full.shape[0], workers.world_size,
    )  # fmt: skip


def is_row_sharded(table: nn.Embedding) -> bool:
    return isinstance(table.weight, DTensor)


def _pad_lookups_to_equal_blocks(table: nn.Embedding, world_size: int) -> None:
    """Around RowwiseParallel's hooks: ids of any shape in, padded to the processes' largest count (flattened);
    vectors of the ids' shape out, whose gradient is divided by the process count on its way back to the table."""
    shapes: list[torch.Size] = []

    def pad(_: nn.Module, inputs: tuple[Any, ...]) -> tuple[torch.Tensor]:
        ids = inputs[0].reshape(-1)
        shapes.append(inputs[0].shape)
        largest = torch.tensor([ids.numel()], device=ids.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return (torch.nn.functional.pad(ids, (0, int(largest) - ids.numel()), value=table.padding_idx or 0),)

    def unpad(_: nn.Module, __: Any, vectors: torch.Tensor) -> torch.Tensor:
        shape = shapes.pop()
        return _GradientScaled.apply(vectors[: shape.numel()].reshape(*shape, vectors.shape[-1]), 1 / world_size)

    table.register_forward_pre_hook(pad, prepend=True)
    table.register_forward_hook(unpad)


class _GradientScaled(torch.autograd.Function):
    """The identity forward; the gradient times `factor` backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


@contextlib.contextmanager
def gathered_item_table(model: nn.Module) -> Iterator[None]:
    """Inside the block the model's item table is whole on every process (a plain `nn.Embedding`, e.g. to score every
    item in evaluation); outside it, sharded again. Nothing when it is not sharded; a collective when it is."""
    table = item_id_table(model)
    if table is None or not is_row_sharded(table):
        yield
        return
    assert isinstance(model, ItemIdTable)
    model.replace_item_id_table(_whole(table))
    try:
        yield
    finally:
        model.replace_item_id_table(table)


def unshard_item_table(model: nn.Module) -> None:
    """Make the item table one plain `nn.Embedding` again, whole on every process (the trained model, to write);
    a collective when it is sharded."""
    table = item_id_table(model)
    if table is not None and is_row_sharded(table):
        assert isinstance(model, ItemIdTable)
        model.replace_item_id_table(_whole(table))


def _whole(table: nn.Embedding) -> nn.Embedding:
    """A plain copy of a sharded table (every block gathered; no lookup hooks)."""
    sharded = table.weight
    assert isinstance(sharded, DTensor)
    whole = nn.Embedding(table.num_embeddings, table.embedding_dim, padding_idx=table.padding_idx)
    whole.weight = nn.Parameter(sharded.full_tensor().detach(), requires_grad=sharded.requires_grad)
    return whole
