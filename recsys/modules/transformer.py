"""Pre-LayerNorm causal transformer blocks for sequential recommenders.

Dimension letters: B batch, L sequence length, D model dim, H heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, L, D), mask (B, 1, L, L) bool (True = may attend) -> (B, L, D)."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, D // self.num_heads).unbind(dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, D/H)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


class TransformerBlock(nn.Module):
    """x + Attn(LN(x)), then x + FFN(LN(x)) with GELU; dropout on both residual branches."""

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, dropout: float, attn_dropout: float) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, num_heads, attn_dropout)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(), nn.Linear(ffn_dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x), mask))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


def causal_segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, L) run ids (0 = padding) -> (B, 1, L, L) attention mask, True = may attend.

    A query attends causally to earlier tokens of its own run. Every query may also attend to
    itself, so padding rows never see an all-masked softmax (their outputs are ignored downstream).
    For one left-padded sequence per row, pass `(item_ids != 0).long()`.
    """
    L = segments.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=segments.device).tril()
    same_run = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] != 0)
    mask = causal & same_run  # (B, L, L)
    mask |= torch.eye(L, dtype=torch.bool, device=segments.device)
    return mask[:, None]


def left_padded_layout(item_ids: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One left-padded history per row -> (item_ids (B, L <= max_len), segments (B, L), positions (L,)).

    Keeps the most recent `max_len` columns; positions count back from the most recent column, as in
    SASRec's left-padded input, so they match the positions of packed training rows.
    """
    item_ids = most_recent(item_ids, max_len)
    L = item_ids.shape[1]
    segments = (item_ids != 0).long()
    positions = torch.arange(max_len - L, max_len, device=item_ids.device)
    return item_ids, segments, positions


def most_recent(columns: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, L) -> (B, min(L, max_len)): the last `max_len` columns.

    Under torch.compile with dynamic shapes, `columns[:, -max_len:]` splits L into L < max_len and L >= max_len (a
    guard of the slice's start), so full-width histories (L = max_len, as validation pads its longest users) and
    shorter ones would compile two graphs; this branch guards L <= max_len instead, which both satisfy.

    Example:
        >>> most_recent(torch.tensor([[1, 2, 3]]), 2).tolist(), most_recent(torch.tensor([[1, 2, 3]]), 5).tolist()
        ([[2, 3]], [[1, 2, 3]])
    """
    return columns[:, -max_len:] if columns.shape[1] > max_len else columns
