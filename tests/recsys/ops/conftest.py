"""Without CUDA, run the Triton kernels in Triton's interpreter.

Triton reads TRITON_INTERPRET when it is imported and when it decorates the kernels: hence here, at
collection time, before any test imports `triton` or `recsys.ops.triton`, rather than in a fixture.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
