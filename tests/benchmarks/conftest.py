"""The benchmark scripts as modules (without CUDA, the kernel benchmarks' --smoke mode runs the Triton kernels in
Triton's interpreter: see tests/conftest.py)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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
