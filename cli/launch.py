"""`--nproc-per-node N`: a command's training on N processes of this host, through torch's elastic launcher.

The command first runs the pipeline's steps before training in this process (preparing data once, not N times),
then starts `python -m cli <the same command>` N times under `torch.distributed.run` (rendezvous on this host), which
gives each process RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT: the processes train together and the
first one writes what the run writes. Across hosts, start the same command with
torchrun instead (`torchrun --nnodes H --nproc-per-node N --rdzv-endpoint HOST:PORT -m cli train ...`): a process that
finds the launcher's variables set trains as one of them, with nothing project-specific to set.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Annotated

import typer

from recsys.errors import RecsysError
from recsys.runtime.distributed import Workers

logger = logging.getLogger(__name__)

LAUNCHED_BY_US = "RECSYS_LAUNCHED_BY"  # set in the processes `launch` starts: the launching command reports, not them

NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc-per-node",
        min=1,
        help="Train on N processes of this host (one per GPU; CPU processes under gloo) through torch's elastic "
        "launcher; default: train.nproc_per_node (1).",
    ),
]


def prints_results() -> bool:
    """Whether this process prints the command's results: one process alone, the launching command, or the first
    process of a run started by torchrun (not one that a launching command started: that command reports)."""
    return Workers.from_environment().is_main and LAUNCHED_BY_US not in os.environ


def needs_launch(nproc_per_node: int) -> bool:
    """Whether this command starts the processes itself: more than one asked, and not already one of them."""
    return nproc_per_node > 1 and not Workers.from_environment().distributed


def launch(nproc_per_node: int, command: Sequence[str]) -> None:
    """Run `python -m cli COMMAND` on `nproc_per_node` processes of this host and wait for them.

    Raises:
        RecsysError: a process failed, naming it; its log is above.
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # no restarts yet: a restarted gloo group often fails to connect here (docs/distributed.md, "Not yet")
    args = ["--standalone", f"--nproc-per-node={nproc_per_node}", "--max-restarts=0", "-m", "cli"]
    logger.info("starting %d processes: recsys %s", nproc_per_node, " ".join(command))
    os.environ[LAUNCHED_BY_US] = str(os.getpid())  # the processes inherit this command's environment
    try:
        torchrun.main([*args, *command])
    except ChildFailedError as err:
        failed = ", ".join(f"rank {rank} (exit code {failure.exitcode})" for rank, failure in err.failures.items())
        raise RecsysError(
            f"the distributed run failed: {failed}. Fix: see that process's error above; running the same command "
            "again resumes from the last validated epoch"
        ) from err
    finally:
        del os.environ[LAUNCHED_BY_US]
