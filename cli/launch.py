"""`--nproc-per-node N`: a command's training on N processes of this host (`pipelines.launcher` starts them).

Across hosts, start the same command with torchrun instead (`torchrun --nnodes H --nproc-per-node N --rdzv-endpoint
HOST:PORT -m cli train ...`): a process that finds the launcher's variables set trains as one of them, with nothing
project-specific to set.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from pipelines.launcher import LAUNCHED_BY_US
from recsys.runtime.distributed import Workers

NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc-per-node",
        min=1,
        help="Train on N processes of this host (one per GPU; CPU processes under gloo) through torch's elastic "
        "launcher; default: train.distributed.nproc_per_node (1).",
    ),
]
MaxRestartsOpt = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        min=0,
        help="With --nproc-per-node: when a process fails, restart them all up to N times; each restart resumes "
        "from the last validated epoch.",
    ),
]


def prints_results() -> bool:
    """Whether this process prints the command's results: one process alone, the launching command, or the first
    process of a run started by torchrun (not one that a launching command started: that command reports)."""
    return Workers.from_environment().is_main and LAUNCHED_BY_US not in os.environ
