"""An item table sharded by rows over the run's processes (`train.shard_item_table`): the table's weight becomes a
DTensor whose rows are split in contiguous blocks, one per process (what the optimizer, the training state and its
N -> M resharding see), and its lookups run on each process's block with two collectives.

Each process looks up its own ids (its share of the batch: its histories, targets and drawn negatives). The lookup
gathers every process's ids (all-gather), each process reads the rows it holds (zeros elsewhere), and a
reduce-scatter returns to each process the sum for its own ids: the vectors, as torchrec's row-wise sharding does.
Processes may look up different numbers of ids; they are padded with the padding row to the largest count, which
the processes agree on first, on their hosts (`recsys.runtime.distributed.reduce_on_hosts`: no GPU waits), since
the collectives need equal blocks. The backward pass runs the same way in reverse: the vectors' gradients of every
process are gathered and each process adds those of its rows into its block's gradient, so the gradient of a block
is complete on the process that holds it, is never all-reduced (DDP skips the table), and is never larger than the
block. That gradient sums every process's weighted loss (`recsys.training.data_parallel`), where DDP averages the
other parameters' gradients, so it is divided by the process count.

(PyTorch's `RowwiseParallel` does the forward the same way, but DTensor has no row-wise rule for the embedding's
backward: each process computed the gradient of the whole table from every process's ids and kept its block,
which cost a (V+1, D) tensor per lookup on every process, more than the block saves; see docs/distributed.md.)

A table of V rows and D columns then costs each of N processes V/N rows of weights, gradients and Adam moments
instead of V. What still reads the whole table (evaluation, the trained model written at the end) gathers it
(`gathered_item_table`, `unshard_item_table`). The lookups are row reads, so the loss must read rows too: the
sampled softmax, not the full one (whose logits against every item would need a vocabulary-parallel softmax).

Dimension letters: V+1 rows, R rows of a block, D dim, N processes, n ids looked up (padded: m).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from recsys.errors import ConfigError
from recsys.runtime.distributed import Workers, reduce_on_hosts
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
    assert table is not None and isinstance(model, ItemIdTable)  # check_shardable said so
    mesh = init_device_mesh(device.type, (workers.world_size,))
    full = table.weight.detach()
    rows = -(-full.shape[0] // workers.world_size)  # DTensor's Shard(0) splits as torch.chunk: blocks of ceil(V+1 / N)
    block = full[workers.rank * rows : (workers.rank + 1) * rows]  # the last blocks may be shorter, or empty
    local = torch.empty_like(block, device=device).copy_(block)
    sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride())
    model.replace_item_id_table(RowShardedEmbedding(table, sharded, first_row=workers.rank * rows))
    logger.info(
        "item table sharded by rows: %d rows of %d on each of %d processes",
        local.shape[0], full.shape[0], workers.world_size,
    )  # fmt: skip


class RowShardedEmbedding(nn.Embedding):
    """An `nn.Embedding` whose weight is a DTensor split by rows (`Shard(0)`), each process holding rows
    [first_row, first_row + R); `forward` looks up any process's ids as the module docstring says.

    Args:
        table: the whole table it replaces (its sizes and padding row; its weight is not kept).
        weight: (V+1, D) the DTensor of the blocks.
        first_row: the table row of this process's first one.
    """

    def __init__(self, table: nn.Embedding, weight: DTensor, first_row: int) -> None:
        super().__init__(table.num_embeddings, table.embedding_dim, table.padding_idx, _weight=weight)
        self.weight.requires_grad_(table.weight.requires_grad)
        self.first_row = first_row

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(...) item_idx -> (..., D) their rows."""
        weight = self.weight
        assert isinstance(weight, DTensor)
        group = weight.device_mesh.get_group()
        n = ids.numel()
        (m,) = reduce_on_hosts([n], "max")  # every process's ids padded to the largest count: equal blocks
        padded = F.pad(ids.reshape(-1), (0, m - n), value=self.padding_idx or 0)  # (m,)
        everyone = padded.new_empty(m * dist.get_world_size(group))  # (N m,)
        dist.all_gather_into_tensor(everyone, padded, group=group)
        block = weight.to_local()  # (R, D); its gradient comes back to the DTensor as Shard(0)
        local = everyone - self.first_row
        held = (local >= 0) & (local < block.shape[0])
        padding = None if self.padding_idx is None else self.padding_idx - self.first_row  # in the block's rows
        padding = padding if padding is not None and 0 <= padding < block.shape[0] else None
        # rows held elsewhere read row 0 of the block and are zeroed: their gradient adds 0 there
        rows = F.embedding(torch.where(held, local, 0), block, padding_idx=padding) * held[:, None].to(block.dtype)
        vectors = _SummedToOwners.apply(rows, group)  # (m, D)
        return vectors[:n].reshape(*ids.shape, vectors.shape[-1])


class _SummedToOwners(torch.autograd.Function):
    """(N m, D) rows -> (m, D): block p of the processes' rows summed, on process p (a reduce-scatter). Backward:
    every process's (m, D) gradient gathered (an all-gather), divided by the process count (the table's gradient
    sums every process's weighted loss, where DDP averages)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        summed = rows.new_empty(rows.shape[0] // world, *rows.shape[1:])
        dist.reduce_scatter_tensor(summed, rows.contiguous(), group=group)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        world = dist.get_world_size(ctx.group)
        everyone = grad.new_empty(grad.shape[0] * world, *grad.shape[1:])
        dist.all_gather_into_tensor(everyone, grad.contiguous(), group=ctx.group)
        return everyone.div_(world), None


def is_row_sharded(table: nn.Embedding) -> bool:
    return isinstance(table.weight, DTensor)


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
