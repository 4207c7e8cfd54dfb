"""The processes of a distributed run: which one this is, its process group, and the few collectives training and
evaluation use.

A run of N processes is started by torch's elastic launcher (`recsys train --nproc-per-node N`, or `torchrun` for
several hosts), which gives each process RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Without them
this is the one process of a single-process run, and nothing here communicates. The backend follows the device the
run trains on: NCCL on CUDA, gloo on CPUs.

Example:
    >>> workers = Workers.from_environment({})
    >>> workers.world_size, workers.is_main, workers.distributed
    (1, True, False)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
import torch.distributed as dist

from recsys.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # what torch's elastic launcher sets in every process


@dataclass(frozen=True)
class Workers:
    """This process's place among the run's processes.

    Args:
        rank: 0..world_size-1 over every host.
        world_size: how many processes train.
        local_rank: 0.. on this host: the GPU this process uses.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    def __post_init__(self) -> None:
        if not (self.world_size >= 1 and 0 <= self.rank < self.world_size and self.local_rank >= 0):
            raise ConfigError(
                f"the launcher's environment is inconsistent: RANK={self.rank}, WORLD_SIZE={self.world_size}, "
                f"LOCAL_RANK={self.local_rank}. Fix: start the run with `recsys train --nproc-per-node N` or torchrun, "
                "which set them, or unset them for a single process"
            )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this process writes what the run writes once (the model, MLflow, the checkpoint's metadata)."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Workers:
        """The place the launcher gave this process (RANK, WORLD_SIZE, LOCAL_RANK); a single process without them.

        Raises:
            ConfigError: the variables are not integers, or are inconsistent.
        """
        environ = os.environ if environ is None else environ
        given = {name: environ.get(name) for name in LAUNCHER_VARIABLES}
        if given["WORLD_SIZE"] is None:
            return cls()
        try:
            values = {name: int(value) if value is not None else 0 for name, value in given.items()}
        except ValueError as err:
            raise ConfigError(
                f"the launcher's environment is not numeric: {given}. Fix: start the run with torchrun or "
                "`recsys train --nproc-per-node N`, or unset RANK / WORLD_SIZE / LOCAL_RANK"
            ) from err
        return cls(rank=values["RANK"], world_size=values["WORLD_SIZE"], local_rank=values["LOCAL_RANK"])

    def device(self, device: torch.device) -> torch.device:
        """The device of this process: its own GPU (`LOCAL_RANK`) when the run trains on CUDA."""
        if device.type == "cuda" and self.distributed:
            return torch.device("cuda", self.local_rank)
        return device


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def join(device: torch.device) -> Workers:
    """This process's place, with the run's process group started (once: a later call finds it started).

    Args:
        device: where the run trains (its type picks the backend).

    Raises:
        ConfigError: the launcher's environment is inconsistent, or the run asks for CUDA on a process without its GPU.
    """
    workers = Workers.from_environment()
    if not workers.distributed or dist.is_initialized():
        return workers
    if device.type == "cuda":
        if workers.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"process {workers.rank} is local rank {workers.local_rank} but this host has "
                f"{torch.cuda.device_count()} GPU(s). Fix: --nproc-per-node at most the GPUs of a host"
            )
        torch.cuda.set_device(workers.local_rank)
    backend = backend_for(device)
    dist.init_process_group(backend, store=_store_of_this_attempt(workers), rank=workers.rank,
                            world_size=workers.world_size)  # fmt: skip
    _host_group()  # a collective: every process makes it here, at the same point
    if workers.is_main:
        logger.info("distributed: %d processes, backend %s", workers.world_size, backend)
    return workers


def _store_of_this_attempt(workers: Workers) -> dist.Store:
    """The key-value store the processes meet in to start their group, with keys of this launcher attempt only.

    Under torch's elastic launcher the processes use the launcher's store, which outlives a restart: the restarted
    processes would find the addresses their predecessors published, under the same keys, and one that reads a
    dead process's address before its successor overwrites it fails to connect (gloo's "connectFullMesh ...
    Connection refused"). Prefixing the keys with the attempt (TORCHELASTIC_RESTART_COUNT) keeps attempts apart.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), workers.world_size,
        is_master=workers.is_main and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True),
    )  # fmt: skip
    return dist.PrefixStore(f"recsys/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


# How long `leave` lets gloo's worker threads finish freeing their last collectives (microseconds of work) before the
# group can be destroyed; generous for a machine whose cores are all busy.
_WORKERS_SETTLE_SECONDS = 0.1


def leave() -> None:
    """End the process group, when one was started (so that the launcher's processes exit cleanly), once every
    process has reached this point: none tears its group down with a collective still in flight.

    Gloo runs collectives on two worker threads, and the worker that ran one frees its Work (and so its tensors,
    Python objects: that takes the GIL) just after it completes. The group is destroyed by whoever drops its last
    reference, holding the GIL, and its destructor joins the workers: a worker still freeing a Work then waits for
    the GIL forever, and so does the destructor (CI hangs, about 1 run in 10 of the distributed benchmark's smoke
    test; gdb showed a worker in ~AsyncAllgatherWork waiting for the GIL while the main thread, in ~Reducer, joined
    it). So, before returning: a barrier whose Work this thread keeps until the group is gone (its worker does not
    free it), then a pause with the GIL released in which the workers free what they still hold."""
    if not dist.is_initialized():
        return
    barrier = dist.barrier(async_op=True) if dist.get_world_size() > 1 else None
    if barrier is not None:
        barrier.wait()
        time.sleep(_WORKERS_SETTLE_SECONDS)
    dist.destroy_process_group()
    _HOST_GROUPS.clear()
    del barrier


def wait_for_everyone() -> None:
    """Block until every process of the run reaches this point (nothing in a single process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def sum_over_workers(values: torch.Tensor) -> torch.Tensor:
    """`values` summed over the run's processes (itself in a single process), on the device they came from."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    summed = values.to(_backend_device(), copy=True)
    dist.all_reduce(summed)
    return summed.to(values.device)


def reduce_on_hosts(values: Sequence[int], op: Literal["sum", "max"] = "sum") -> list[int]:
    """`values`, integers every process already holds on its host (counts, shapes), summed (or their maximum) over the
    run's processes; themselves in a single process.

    They travel over gloo between the hosts' CPUs whatever the run's backend: nothing waits on a GPU. The same
    exchange over NCCL would put the integers on the GPU and read the result back (`.item()`), which makes the host
    wait until its GPU has run everything queued before it: the host then queues nothing while the GPU works.

    Example:
        >>> reduce_on_hosts([3, 5], "max")  # a single process
        [3, 5]
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    summed = torch.tensor(list(values), dtype=torch.int64)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=_host_group())
    return [int(value) for value in summed.tolist()]


# the gloo group of the run's processes beside an NCCL default group, by the default group it was made for
_HOST_GROUPS: dict[int, dist.ProcessGroup] = {}


def _host_group() -> dist.ProcessGroup | None:
    """A group of every process over gloo (CPU tensors) for `reduce_on_hosts`: the default group when it is gloo
    already (None), else one made once per default group (`join` makes it, every process at the same point; made
    here on first use otherwise, which is a collective too)."""
    if dist.get_backend() == "gloo":
        return None
    key = id(dist.group.WORLD)
    if key not in _HOST_GROUPS:
        _HOST_GROUPS[key] = dist.new_group(backend="gloo")
    return _HOST_GROUPS[key]


def from_main(value: T) -> T:
    """The first process's `value` (a picklable object), on every process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def _backend_device() -> torch.device:
    """Where the started backend reads tensors: this process's GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_rows(rows: torch.Tensor, workers: Workers) -> list[torch.Tensor]:
    """Every process's `rows` (same trailing shape, any number of rows each), in rank order.

    The tensors travel on the device the backend reads: the CUDA device under NCCL, the CPU under gloo.
    """
    if not workers.distributed:
        return [rows]
    device = _backend_device()
    count = torch.tensor([len(rows)], device=device)
    counts = [torch.empty_like(count) for _ in range(workers.world_size)]
    dist.all_gather(counts, count)
    longest = int(max(int(c) for c in counts))
    padded = torch.zeros((longest, *rows.shape[1:]), dtype=rows.dtype, device=device)
    padded[: len(rows)] = rows.to(device)
    gathered = [torch.empty_like(padded) for _ in range(workers.world_size)]
    dist.all_gather(gathered, padded)
    return [part[: int(c)].to(rows.device) for part, c in zip(gathered, counts, strict=True)]
