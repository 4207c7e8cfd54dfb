"""A run's training on N processes of this host, through torch's elastic launcher: what `recsys train
--nproc-per-node N`, `recsys pipeline run --nproc-per-node N` and the `daily_training` DAG's train task share.

The caller first runs the pipeline's steps before training itself (preparing data once, not N times), then starts
`python -m cli <a command>` N times under `torch.distributed.run` (rendezvous on this host), which gives each process
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT: the processes train together and the first one writes what
the run writes. The processes run the platform's command line (`python -m cli`, where every process of a run starts,
under torchrun across hosts too); `launch` takes that command's arguments as strings, so nothing here imports `cli`.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from recsys.errors import RecsysError
from recsys.runtime.distributed import Workers

logger = logging.getLogger(__name__)

LAUNCHED_BY_US = "RECSYS_LAUNCHED_BY"  # set in the processes `launch` starts: the launching command reports, not them
# The thread pools each process sizes from these at start (torch's intra-op pool, polars'): left unset, each of N
# processes takes one thread per core, and N x cores spinning threads slow the CPU-side work (reading and packing
# batches) many times over
THREAD_VARIABLES = ("OMP_NUM_THREADS", "POLARS_MAX_THREADS")


def threads_each(processes: int) -> int:
    """Each of `processes` processes' share of this host's cores: `cores // processes`, at least 1."""
    return max(1, (os.cpu_count() or 1) // processes)


@contextmanager
def cores_shared(processes: int) -> Iterator[None]:
    """While the processes start, give each `threads_each(processes)` threads through `THREAD_VARIABLES` (the
    processes inherit the environment); a variable the user set is kept."""
    threads = str(threads_each(processes))
    chosen = {name: threads for name in THREAD_VARIABLES if name not in os.environ}
    if chosen:
        logger.info("%d processes on %d cores: %s thread(s) each (%s)", processes, os.cpu_count() or 1, threads,
                    ", ".join(chosen))  # fmt: skip
    os.environ.update(chosen)
    try:
        yield
    finally:
        for name in chosen:
            del os.environ[name]


def needs_launch(nproc_per_node: int) -> bool:
    """Whether this process starts the processes itself: more than one asked, and not already one of them."""
    return nproc_per_node > 1 and not Workers.from_environment().distributed


def launch(nproc_per_node: int, command: Sequence[str], max_restarts: int = 0) -> None:
    """Run `python -m cli COMMAND` on `nproc_per_node` processes of this host and wait for them.

    Args:
        nproc_per_node: how many processes.
        command: the `recsys` command each runs.
        max_restarts: when a process fails, the launcher stops the others and starts them all again, up to this many
            times; they resume from the last validated epoch's training state.

    Raises:
        RecsysError: a process failed (after the restarts), naming it; its log is above.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = ["--standalone", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}", "-m", "cli"]
    logger.info("starting %d processes: recsys %s", nproc_per_node, " ".join(command))
    os.environ[LAUNCHED_BY_US] = str(os.getpid())  # the processes inherit this command's environment
    try:
        with cores_shared(nproc_per_node):
            torchrun.main([*args, *command])
    except ChildFailedError as err:
        failed = ", ".join(f"rank {rank} (exit code {failure.exitcode})" for rank, failure in err.failures.items())
        raise RecsysError(
            f"the distributed run failed: {failed}. Fix: see that process's error above; running it again (the same "
            "command, or the task's retry) resumes from the last validated epoch"
        ) from err
    finally:
        del os.environ[LAUNCHED_BY_US]


def run_on_processes(
    processes: int, entry: Callable[..., Any], *arguments: Any, max_restarts: int = 0
) -> dict[int, Any]:
    """`entry(*arguments)` on `processes` processes of this host, started by torch's elastic launcher (a rendezvous
    on a free local port; `entry` must be importable: the processes are spawned). Returns each rank's return value."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
        rdzv_endpoint="localhost:0", max_restarts=max_restarts, start_method="spawn", monitor_interval=0.1,
    )  # fmt: skip
    with cores_shared(processes):
        returned: dict[int, Any] = elastic_launch(config, entry)(*arguments)
    return returned
