"""The benchmark scripts as modules; without CUDA, the kernel benchmark's --smoke mode runs the Triton kernels in
Triton's interpreter (set at collection time, before any test imports `triton`; see tests/recsys/ops/conftest.py).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@functools.cache
def load_benchmark(relative_path: str) -> ModuleType:
    """benchmarks/<relative_path> as a module (the scripts are CLIs under benchmarks/, not an installed package)."""
    path = BENCHMARKS / relative_path
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
