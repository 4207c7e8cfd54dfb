"""Checkpoint files and directories, written atomically (a crash never leaves a truncated one).

A single file (`save_checkpoint`) holds what one process writes. A training state goes to a directory in
`torch.distributed.checkpoint`'s format instead (`save_distributed_checkpoint`): every process writes its part of it,
and a state saved by N processes loads on M, each process reading what it holds (a replicated weight whole, a sharded
one its rows). The processes must see the same directory: one host, or a filesystem shared by the hosts.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner

from recsys.runtime.atomic import atomic_directory, atomic_file
from recsys.runtime.distributed import Workers, from_main, wait_for_everyone

DCP_METADATA = ".metadata"  # the file torch.distributed.checkpoint writes last, naming every saved entry


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """torch.save `payload` (tensors and plain Python values) to `path` atomically."""
    with atomic_file(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` on the CPU."""
    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return payload


def save_distributed_checkpoint(directory: Path, state: dict[str, Any], workers: Workers) -> None:
    """Every process saves `state` (nested dicts of tensors, DTensors and plain values) into `directory` together;
    the directory is replaced whole once all have written, so a crash leaves the previous state.

    Called by every process of the run at the same point (it is a collective).
    """
    if not workers.is_main:
        _save(state, Path(from_main("")), workers)
        wait_for_everyone()  # rank 0 swaps the directory in
        return
    with atomic_directory(directory, marker=DCP_METADATA) as tmp:
        _save(state, Path(from_main(str(tmp))), workers)  # returns once every process has written its part
    wait_for_everyone()


def load_distributed_checkpoint(directory: Path, template: dict[str, Any], workers: Workers) -> None:
    """Fill `template` in place from `directory` (written by `save_distributed_checkpoint` on any number of
    processes): its tensors say where each entry goes and how it is sharded; its plain values are replaced. Every
    entry of `template` must be in the directory; entries it leaves out are not read."""
    with _one_process_quietly(workers):
        # torchrec's sharded tables are ShardedTensors: loaded as they are, not flattened as FSDP's would be
        planner = DefaultLoadPlanner(flatten_sharded_tensors=False)
        dcp.load(template, checkpoint_id=directory, planner=planner, no_dist=not workers.distributed)


def _save(state: dict[str, Any], directory: Path, workers: Workers) -> None:
    with _one_process_quietly(workers):
        dcp.save(state, checkpoint_id=directory, no_dist=not workers.distributed)


@contextmanager
def _one_process_quietly(workers: Workers) -> Iterator[None]:
    """Without a process group, torch.distributed.checkpoint warns that it assumes one process on every call: it is
    the expected case of a single-process run, not news."""
    with warnings.catch_warnings():
        if not workers.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def saved_entries(directory: Path) -> set[str]:
    """The names of a distributed checkpoint's entries, nested keys joined by "." (e.g. "model.pos_emb.weight")."""
    return set(dcp.FileSystemReader(directory).read_metadata().state_dict_metadata)


def is_distributed_checkpoint(directory: Path) -> bool:
    return (directory / DCP_METADATA).is_file()


def keep_saved(template: dict[str, Any], entries: set[str], prefix: str) -> dict[str, Any]:
    """`template` (the part of a state named `prefix`) without the leaves a checkpoint does not hold: e.g. the
    optimizer state of parameters that had no gradient before it was saved."""
    kept: dict[str, Any] = {}
    for key, value in template.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            kept[key] = keep_saved(value, entries, name)
        elif name in entries or any(entry.startswith(f"{name}.") for entry in entries):
            kept[key] = value
    return kept
