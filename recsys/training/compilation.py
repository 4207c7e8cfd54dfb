"""`train.hardware.compile`: how the platform runs a model through torch.compile, with the batch and the sequence
length dynamic.

A sequential model's forward sees every batch size (an epoch's last, shorter batch; each process's share of rows)
and every history length: packed training rows are `max_history` wide, but validation and scoring pad each batch to
its own longest history (1..max_history). `dynamic=True` makes every size of the inputs symbolic from the first
call, for every caller of the forward: the recipe's loss, `score` and `encode_queries` (they call the module).
`torch._dynamo.mark_dynamic` would need each of those call sites to mark its tensors before the call, and one that
forgot would compile a static graph, then recompile. Parameters keep static shapes (dynamo's default
`force_parameter_static_shapes`), so the model's widths stay constants the backend can specialise on.

The model's Python floats (dropout rates, normalisation epsilons) are compiled as the constants they are. Under
`dynamic=True` dynamo would trace each as a symbolic input; the first operator whose arguments need a concrete float
specialises it, and dynamo then restarts its whole analysis of the function: every compiled function was traced (and
its backward traced by AOTAutograd) twice, which made tracing up to twice as long (docs/training.md). The setting is
dynamo's, process-wide.

Inductor's memory-coalescing tiling analysis is off: its own settings note that it "does not yet apply to dynamic
shapes", yet on CUDA it runs on them, and torch 2.11's asserts on a fused reduction whose symbolic sizes it cannot
prove equal (pytorch/pytorch#181563: the generative loss compiled with its forward hit it). Inductor then picks tilings
as it does with the analysis unset.

What still compiles a graph of its own: a switch between training and evaluation (dropout; gradients), each path of
the forward (packed rows vs left-padded histories), and a size of 0 or 1 (dynamo specialises those: a batch of one
row, a history of one item), each once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import list_mode_options

from recsys.training.config import CompileMode


def compile_model(
    model: nn.Module, mode: CompileMode = "default", backend: str | Callable[..., Any] = "inductor"
) -> None:
    """Compile `model`'s forward in place (`nn.Module.compile`): every later `model(...)` call runs compiled, with
    dynamic batch and sequence sizes. `backend`: "inductor" to train; tests count graphs with "aot_eager", which
    makes the same graphs and guards (dynamo decides them before any backend) without generating kernels, or read
    them with a backend of their own (a callable)."""
    torch._dynamo.config.specialize_float = True  # see the module docstring: no restarted analysis
    if backend == "inductor":
        model.compile(dynamic=True, options=_inductor_options(mode))
    else:
        model.compile(dynamic=True, mode=mode, backend=backend)


def _inductor_options(mode: CompileMode) -> dict[str, Any]:
    """Inductor's settings for `mode` with dynamic shapes, as `torch.compile(mode=...)` sets them (it takes a mode or
    options, not both), with the coalescing tiling analysis off (see the module docstring)."""
    return {**list_mode_options(mode, dynamic=True), "triton.coalesce_tiling_analysis": False}


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (first compilations and recompilations of every function, graph
    breaks counted as graphs) since the last `torch._dynamo.reset()` or `counters.clear()`."""
    return counters["stats"]["unique_graphs"]
