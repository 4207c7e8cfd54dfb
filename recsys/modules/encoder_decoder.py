"""A pre-LayerNorm encoder-decoder transformer whose decoder reads one memory for several decoded sequences.

The math and the parameter names are those of `nn.Transformer(norm_first=True, batch_first=True)` (ReLU feed-forward,
final LayerNorms after both stacks), so its state dicts load here unchanged and give the same outputs. What differs:
the decoder takes the memory of B sources for B * G target sequences (G per source: the beams of a beam search, the
candidate items scored for one user). Cross-attention has no interaction between query positions, so the G sequences
of a source are read as one query sequence of G * t tokens against that source's memory: the memory is never
repeated G times, and its keys and values are projected once per source instead of once per sequence. Attention is
`F.scaled_dot_product_attention`; no mask is compared on the host (nothing breaks a compiled graph).

Dimension letters: B sources, G target sequences per source, S source tokens, t target tokens, D dim, H heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head attention with `nn.MultiheadAttention`'s parameters (`in_proj_weight` (3D, D), `in_proj_bias`,
    `out_proj`); `dropout` on the attention weights while training."""

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads, self.dropout = num_heads, dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False
    ) -> torch.Tensor:
        """queries (N, Lq, D), keys = values (N, Lk, D), mask broadcastable to (N, H, Lq, Lk) bool, True = may attend,
        or `causal` (query i attends to keys 0..i) -> (N, Lq, D)."""
        N, Lq, D = queries.shape
        w, b = self.in_proj_weight, self.in_proj_bias
        q = F.linear(queries, w[:D], b[:D])
        k, v = F.linear(keys, w[D:], b[D:]).chunk(2, dim=-1)
        q, k, v = (x.unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for x in (q, k, v))  # (N, H, L, D/H)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        return self.out_proj(y.transpose(1, 2).reshape(N, Lq, D))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(dim, ffn_dim), nn.Linear(ffn_dim, dim)
        self.dropout = nn.Dropout(dropout)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class EncoderLayer(_FeedForward):
    def __init__(self, dim: int, num_heads: int, ffn_dim: int, dropout: float) -> None:
        super().__init__(dim, ffn_dim, dropout)
        self.self_attn = Attention(dim, num_heads, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.dropout1(self.self_attn(h, h, mask))
        return x + self.dropout2(self.feed_forward(self.norm2(x)))


class DecoderLayer(_FeedForward):
    def __init__(self, dim: int, num_heads: int, ffn_dim: int, dropout: float) -> None:
        super().__init__(dim, ffn_dim, dropout)
        self.self_attn = Attention(dim, num_heads, dropout)
        self.multihead_attn = Attention(dim, num_heads, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """x (B * G, t, D), memory (B, S, D), memory_mask (B, 1, 1, S) -> (B * G, t, D)."""
        h = self.norm1(x)
        x = x + self.dropout1(self.self_attn(h, h, causal=True))
        B, t = memory.shape[0], x.shape[1]
        grouped = self.norm2(x).reshape(B, -1, x.shape[2])  # (B, G * t, D): a source's sequences, one query run
        x = x + self.dropout2(self.multihead_attn(grouped, memory, memory_mask).reshape(-1, t, x.shape[2]))
        return x + self.dropout3(self.feed_forward(self.norm3(x)))


class _Stack(nn.Module):
    def __init__(self, layers: list[nn.Module], dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(dim)


class EncoderDecoder(nn.Module):
    """`nn.Transformer(dim, num_heads, ..., batch_first=True, norm_first=True)`'s layers, with a decoder that reads
    one memory for G target sequences (module docstring)."""

    def __init__(
        self, dim: int, num_heads: int, num_encoder_layers: int, num_decoder_layers: int, ffn_dim: int, dropout: float
    ) -> None:
        super().__init__()
        self.encoder = _Stack([EncoderLayer(dim, num_heads, ffn_dim, dropout) for _ in range(num_encoder_layers)], dim)
        self.decoder = _Stack([DecoderLayer(dim, num_heads, ffn_dim, dropout) for _ in range(num_decoder_layers)], dim)
        for parameter in self.parameters():  # as nn.Transformer initialises its matrices
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)

    def encode(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """x (B, S, D), padding (B, S) bool, True = a padding token (no query attends to it) -> memory (B, S, D)."""
        mask = ~padding[:, None, None, :]
        for layer in self.encoder.layers:
            x = layer(x, mask)
        return self.encoder.norm(x)

    def decode(self, x: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor) -> torch.Tensor:
        """Causal decoding of B * G target sequences, G per source (rows b * G .. b * G + G - 1 read source b).

        Args:
            x: (B * G, t, D) embedded target tokens.
            memory, memory_padding: from `encode`, (B, S, D) and (B, S).

        Returns:
            (B * G, t, D).
        """
        if x.shape[0] % memory.shape[0]:
            raise ValueError(
                f"{x.shape[0]} target sequences do not split evenly over {memory.shape[0]} sources: pass G sequences "
                "per source, those of a source next to each other"
            )
        mask = ~memory_padding[:, None, None, :]
        for layer in self.decoder.layers:
            x = layer(x, memory, mask)
        return self.decoder.norm(x)
