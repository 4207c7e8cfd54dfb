"""Benchmarks of the kernels (recsys/ops) and of a training step that uses them.

Without CUDA the kernels run in Triton's interpreter, which Triton reads when it is first imported: this package is
imported before any of its modules, so it sets that here, before benchmarks.common (whose imports reach
torch._dynamo, which imports triton) and recsys.ops.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
