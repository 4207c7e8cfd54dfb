"""torch.compile's artifacts kept between runs: a re-run of one model (a nightly retrain, a resumed or longer run)
loads what an earlier run compiled instead of compiling it again.

`torch.compiler.save_cache_artifacts` serialises what this process compiled (inductor's kernels, AOTAutograd's
graphs, the dynamic-shape profile); `load_cache_artifacts`, called before anything compiles, puts them in the local
caches, so the later compilations hit them. Dynamo still traces the model (no cache skips that part). The artifacts are
keyed by what they were compiled from (graph, torch version, device), so a file from another model or machine only
misses. A file that does not load (another torch, cut short) is logged and ignored: a cache never fails a run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from recsys.runtime.atomic import atomic_file

logger = logging.getLogger(__name__)


def load_compile_cache(path: Path) -> bool:
    """Load the artifacts of `path` into this process's compile caches, before the model compiles; whether any
    were loaded (False: no file, or one that does not load, logged)."""
    if not path.is_file():
        logger.info("no compile cache at %s yet: compiling from scratch (this run writes it)", path)
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception:  # a cache is an optimisation: whatever is wrong with it, compile as without it
        logger.warning("compile cache %s did not load; compiling from scratch", path, exc_info=True)
        return False
    if info is None:
        logger.warning("compile cache %s holds nothing this torch reads; compiling from scratch", path)
        return False
    loaded = {kind: len(keys) for kind, keys in info.artifacts.items()}
    logger.info("compile cache %s loaded: %s", path, loaded)
    return True


def save_compile_cache(path: Path) -> bool:
    """Write what this process compiled so far to `path` (atomically: a reader sees the old file or the new one);
    whether anything was written (False: nothing compiled)."""
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None:
        return False
    payload, info = artifacts
    with atomic_file(path) as tmp:
        tmp.write_bytes(payload)
    logger.info("compile cache written to %s (%d bytes: %s)", path, len(payload),
                {kind: len(keys) for kind, keys in info.artifacts.items()})  # fmt: skip
    return True
