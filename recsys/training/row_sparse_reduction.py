"""An item table's gradient averaged over the processes by the rows a step touched, not as a whole.

With the sampled softmax a step reads a few thousand rows of the item table (its inputs, targets and negatives), yet
the table's gradient is dense: DDP would all-reduce all V x D of it, 512 MB for 10^6 items at dim 128, after the
backward pass has ended (the input lookup is the forward's first operator, so that gradient is complete last) with
nothing left to overlap it. Here the table stays out of DDP; when its gradient is complete (a hook at the end of the
backward pass), each process gathers the rows whose gradient is not zero, at most `bound` of them, every process's
rows are added into the gradient and it is divided by the processes: DDP's average, up to the order of float sums.

The bound is a count the host knows without asking the GPU (the step's ids: inputs + targets + negatives, summed
over the processes), so finding the rows (`torch.nonzero_static`) and gathering them never waits on the device. A
step that touched more rows than its bound (a model that reads the table elsewhere) is caught when the epoch ends
(`check`), which then refuses to go on.
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
    """

    def __init__(self, table: torch.Tensor, workers: Workers, syncing: Callable[[], bool]) -> None:
        self.workers = workers
        self.syncing = syncing
        self.bound = 0  # rows the gradient may hold since the last update, summed over the processes
        self.overflow = torch.zeros((), dtype=torch.bool, device=table.device)
        with torch.no_grad():  # DDP broadcasts the weights it holds; this one it does not hold
            dist.broadcast(table.data, src=0)
        table.register_post_accumulate_grad_hook(self._reduce)

    def expect(self, rows: int) -> None:
        """A backward pass that reads at most `rows` rows of the table (over every process) is about to run."""
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
