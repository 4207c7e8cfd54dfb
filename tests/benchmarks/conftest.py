"""Without CUDA, the kernel benchmark's --smoke mode runs the Triton kernels in Triton's interpreter.

Set at collection time, before any test imports `triton` (see tests/recsys/ops/conftest.py).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
