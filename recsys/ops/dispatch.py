"""Backend choice shared by every op: the `Kernel` enum, the log-once record, loading Triton / FBGEMM backends.

An op passes its name, its logger and its Triton (and FBGEMM) module; the rules are the same for all:
`kernel=None` picks TRITON on CUDA when Triton is installed (or the op's own default), else TORCH; an
explicit request that cannot run raises `KernelUnavailableError` saying what to do; the choice is logged
once per (op, kernel, device). Under torch.compile the choice is made once, eagerly, when the graph is traced (no
graph break).
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.util
import logging
from types import ModuleType

import torch


class Kernel(enum.Enum):
    TORCH = "torch"
    TRITON = "triton"
    FBGEMM = "fbgemm"


class KernelUnavailableError(RuntimeError):
    """An explicitly requested kernel cannot run here; the message says what to do instead."""


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def log_choice(logger_name: str, op: str, kernel: Kernel, device_type: str, how: str) -> None:
    logging.getLogger(logger_name).info("%s: %s kernel on %s (%s)", op, kernel.name, device_type, how)


def triton_backend(module: str, device: torch.device) -> ModuleType:
    """`recsys.ops.triton.<module>`, or `KernelUnavailableError` when its kernels cannot run on `device`."""
    if not triton_available():
        raise KernelUnavailableError(
            "Kernel.TRITON needs the `triton` package (CUDA builds of torch bring it; on CPU `pip install triton`), "
            "or pass kernel=Kernel.TORCH"
        )
    backend = importlib.import_module(f"recsys.ops.triton.{module}")
    if device.type != "cuda" and not backend.INTERPRETED:
        raise KernelUnavailableError(
            f"Kernel.TRITON cannot run on {device.type} tensors: move them to a CUDA device, pass "
            "kernel=Kernel.TORCH, or (slow, for tests) set TRITON_INTERPRET=1 before `triton` is first imported "
            "to run the kernels in Triton's interpreter"
        )
    return backend


def fbgemm_backend(module: str, device: torch.device) -> ModuleType:
    """`recsys.ops.fbgemm.<module>`, or `KernelUnavailableError` when fbgemm_gpu cannot run it on `device`."""
    if importlib.util.find_spec("fbgemm_gpu") is None:
        raise KernelUnavailableError(
            "Kernel.FBGEMM needs fbgemm_gpu (`make setup` installs fbgemm-gpu on CUDA machines, fbgemm-gpu-cpu "
            "elsewhere; pins in pyproject.toml), or pass kernel=Kernel.TRITON (CUDA) / kernel=Kernel.TORCH"
        )
    backend = importlib.import_module(f"recsys.ops.fbgemm.{module}")
    if not backend.runs_on(device.type):
        raise KernelUnavailableError(
            f"the installed fbgemm_gpu has no {device.type} kernel for this op (its CPU build cannot take CUDA "
            "tensors): install the matching fbgemm-gpu build, or pass kernel=Kernel.TRITON (CUDA) / "
            "kernel=Kernel.TORCH"
        )
    return backend


def select_kernel(
    op: str,
    kernel: Kernel | None,
    device: torch.device,
    *,
    logger_name: str,
    triton_module: str,
    fbgemm_module: str | None = None,
    fbgemm_missing: str = "",
    default: tuple[Kernel, str] | None = None,
) -> Kernel:
    """The kernel that will run `op` on `device`: `kernel` itself (raising if it cannot), or the best available.

    Args:
        fbgemm_module: the op's module under `recsys.ops.fbgemm`, None when it has no FBGEMM backend.
        fbgemm_missing: why the op has no FBGEMM kernel (the start of the error message), when it has none.
        default: (kernel, why) chosen when `kernel` is None, instead of choosing by availability.
    """
    # Looked up by its value: torch.compile keeps the identity of a member read from a module-level dict, not of a
    # constant result (and torch 2.11's dynamo cannot trace `Kernel(value)`).
    return _KERNEL_OF_VALUE[
        _selected_value(op, kernel, device, logger_name, triton_module, fbgemm_module, fbgemm_missing, default)
    ]


_KERNEL_OF_VALUE = {kernel.value: kernel for kernel in Kernel}


@torch.compiler.assume_constant_result  # torch.compile runs it once, eagerly: no graph break at its imports and logs
def _selected_value(
    op: str,
    kernel: Kernel | None,
    device: torch.device,
    logger_name: str,
    triton_module: str,
    fbgemm_module: str | None,
    fbgemm_missing: str,
    default: tuple[Kernel, str] | None,
) -> str:
    if kernel is None:
        chosen, how = default or (
            Kernel.TRITON if device.type == "cuda" and triton_available() else Kernel.TORCH,
            "chosen by availability",
        )
        log_choice(logger_name, op, chosen, device.type, how)
        return chosen.value
    if kernel is Kernel.FBGEMM and fbgemm_module is not None:
        fbgemm_backend(fbgemm_module, device)  # raises if it cannot run
    elif kernel is Kernel.FBGEMM:
        raise KernelUnavailableError(
            f"{fbgemm_missing}: pass kernel=Kernel.TRITON (CUDA), kernel=Kernel.TORCH, or kernel=None to choose by "
            "availability"
        )
    how = "requested"
    if kernel is Kernel.TRITON and triton_backend(triton_module, device).INTERPRETED:  # raises if it cannot run
        how = "requested, in Triton's interpreter"
    log_choice(logger_name, op, kernel, device.type, how)
    return kernel.value
