"""Recall of an approximate top-k against the exact one."""

from __future__ import annotations

import torch


def recall_at_k(approx_ids: torch.Tensor, exact_ids: torch.Tensor) -> float:
    """Mean over queries of |approx ∩ exact| / k, both (B, k) int64 (id -1 = a missing result, never a hit)."""
    if approx_ids.shape != exact_ids.shape or approx_ids.ndim != 2:
        raise ValueError(
            f"both id tensors must be (B, k) of one shape, got {tuple(approx_ids.shape)} and {tuple(exact_ids.shape)}"
        )
    approx_ids, exact_ids = approx_ids.cpu(), exact_ids.cpu()
    hits = (approx_ids[:, :, None] == exact_ids[:, None, :]).any(dim=2) & (approx_ids >= 0)  # (B, k)
    return float(hits.float().mean()) if hits.numel() else 0.0
