"""Where and in which precision to compute: shared by training, embedding and tokenizer fitting."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """ "auto" -> cuda when available, else cpu; anything else as torch.device(name)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def use_bf16_autocast(precision: str, device: torch.device) -> bool:
    """Whether to compute under bf16 autocast.

    Args:
        precision: "bf16", "fp32", or "auto" = bf16 on CUDA and on CPUs with native bf16 matmuls
            (AVX512-BF16 / AMX, as oneDNN reports), else fp32.
        device: where the model runs.
    """
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
