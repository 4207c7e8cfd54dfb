"""Where and in which precision to compute, and with how many CPU threads: shared by training, embedding and tokenizer
fitting.

On a CPU, bf16 autocast helps only where the CPU multiplies in bf16 natively (the avx512_bf16 or amx_bf16 flags):
oneDNN also reports bf16 "supported" on CPUs that emulate it, and a Xeon without those flags ran Beauty epochs 1.5x
slower under it, so the flags decide, not oneDNN. CPU threads stay torch's default (one per core) unless set: a
one-off timing probe was tried and not kept, because it measures the machine's load at one moment (on a shared
2-core machine it chose one thread while a neighbour ran, then trained slower than two once the neighbour was done);
on a machine shared with other jobs, set `train.threads`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # /proc/cpuinfo flags of bf16 matmul instructions


def resolve_device(name: str) -> torch.device:
    """ "auto" -> cuda when available, else cpu; anything else as torch.device(name)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def use_bf16_autocast(precision: str, device: torch.device) -> bool:
    """Whether to compute under bf16 autocast.

    Args:
        precision: "bf16", "fp32", or "auto" = bf16 on CUDA (where supported) and on CPUs with native bf16 matmuls,
            else fp32.
        device: where the model runs.
    """
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(native_cpu_bf16())


def native_cpu_bf16() -> list[str]:
    """The CPU's flags of native bf16 matmuls (empty: none, or not Linux)."""
    return sorted(NATIVE_BF16_FLAGS & cpu_flags())


def apply_cpu_threads(threads: int | None) -> None:
    """Set torch's CPU threads (`threads`; None: torch's default, one per core) and log the CPU's compute choices."""
    if threads is not None:
        torch.set_num_threads(threads)
    native = native_cpu_bf16()
    why = f"native bf16 matmuls ({', '.join(native)})" if native else "no native bf16 matmuls (no avx512_bf16/amx_bf16)"
    chosen = torch.get_num_threads()
    logger.info("CPU: %d thread%s (%s); %s", chosen, "s" if chosen > 1 else "", "set" if threads else "default", why)


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere: no native bf16 is assumed)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return frozenset()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()
