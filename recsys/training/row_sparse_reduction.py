"""An item table's gradient averaged over the processes by the rows a step touched, not as a whole.

With the sampled softmax a step reads a few thousand rows of the item table (its inputs, targets and negatives), yet
the table's gradient is dense: DDP would all-reduce all V x D of it, 512 MB for 10^6 items at dim 128, after the
backward pass has ended (the input lookup is the forward's first operator, so that gradient is complete last) with
nothing left to overlap it. Here the table stays out of DDP; when its gradient is complete (a hook at the end of the
backward pass), each process gathers the rows whose gradient is not zero, at most `bound` of them, every process's
rows are added into the gradient and it is divided by the processes: DDP's average, up to the order of float sums.

The bound is a count the hosts know without asking a GPU (the most ids any one process's step read: inputs + targets
+ negatives), so finding the rows (`torch.nonzero_static`) and gathering them never waits on the device. A step that
touched more rows than its bound (a model that reads the table elsewhere) is caught when the epoch ends (`check`),
which then refuses to go on.

Gathering pays only while the rows are a small part of the table: gathering a row and adding it back costs several
times a row of the dense all-reduce (2 H200s at 2,048 rows per GPU: 836k rows gathered, `index_add_` alone 3.2 ms,
against 1.65 ms for the all-reduce of all 10^6 rows; docs/distributed.md), so above `dense_above` of the table (the
rows gathered from every process over the table's) the gradient is all-reduced whole.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from recsys.runtime.distributed import Workers


class RowSparseReduction:
    """Averages `table`'s gradient over `workers`' processes by its touched rows (see the module's docstring).

    Args:
        table: the item table's weight, left out of DDP (the caller's part).
        workers: the run's processes.
        syncing: whether the backward pass now running ends an update (False inside DDP's `no_sync`).
        dense_above: the rows gathered from every process, as a share of the table's, above which the whole gradient
            is all-reduced instead (0: always; the number of processes: never).
    """

    def __init__(
        self, table: torch.Tensor, workers: Workers, syncing: Callable[[], bool], dense_above: float = 0.3
    ) -> None:
        self.workers = workers
        self.syncing = syncing
        self.dense_above = dense_above
        self.bound = 0  # rows any one process's gradient may hold since the last update
        self.overflow = torch.zeros((), dtype=torch.bool, device=table.device)
        with torch.no_grad():  # DDP broadcasts the weights it holds; this one it does not hold
            dist.broadcast(table.data, src=0)
        table.register_post_accumulate_grad_hook(self._reduce)

    def expect(self, rows: int) -> None:
        """A backward pass that reads at most `rows` rows of the table on any one process is about to run."""
        self.bound += rows

    def check(self) -> None:
        """Raise if a step touched more rows than its bound (reads the device: call it once an epoch)."""
        if bool(self.overflow):
            raise RuntimeError(
                "the item table's gradient held more rows than the steps read by their ids, so the row-sparse average "
                "over the processes dropped some of it: this model reads its table elsewhere too. Fix: train it on "
                "one process, or with train.distributed.shard_item_table: true, and report the model's config (a "
                "bug: recsys.training.data_parallel._table_read_by_ids should not have chosen it)"
            )

    @torch.no_grad()
    def _reduce(self, table: torch.Tensor) -> None:
        if not self.syncing():
            return
        grad = table.grad
        assert grad is not None  # the hook runs once it is accumulated
        capacity = max(1, min(self.bound, grad.shape[0]))
        self.bound = 0
        if capacity * self.workers.world_size > self.dense_above * grad.shape[0]:
            dist.all_reduce(grad)
            grad.div_(self.workers.world_size)
            return
        touched = grad.ne(0).any(dim=1)
        count = touched.sum()
        self.overflow |= count > capacity
        rows = torch.nonzero_static(touched, size=capacity, fill_value=0).squeeze(1)
        real = torch.arange(capacity, device=grad.device) < count  # the rest is filling (row 0, weighted 0)
        values = grad.index_select(0, rows) * real[:, None].to(grad.dtype)
        every_rows = [torch.empty_like(rows) for _ in range(self.workers.world_size)]
        every_values = [torch.empty_like(values) for _ in range(self.workers.world_size)]
        dist.all_gather(every_rows, rows)
        dist.all_gather(every_values, values)
        grad.zero_()
        grad.index_add_(0, torch.cat(every_rows), torch.cat(every_values))
        grad.div_(self.workers.world_size)
