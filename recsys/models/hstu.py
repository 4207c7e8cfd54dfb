"""HSTU (Zhai et al., ICML 2024, "Actions Speak Louder than Words"): hierarchical sequential transduction units.

Each layer replaces softmax attention + feed-forward by one gated unit:
    U, V, Q, K = split(SiLU(W1 LayerNorm(x)))
    A          = SiLU(Q K^T + relative position bias) / max_len, causal within each user's run
    x         <- x + W2 (LayerNorm(A V) * U)
The pointwise SiLU (no softmax) keeps the strength of a preference instead of normalising it away. Outputs and
item vectors are L2-normalised and the logits divided by a temperature, as in the paper's retrieval configs.
Training and scoring follow SASRec (packed rows: compute follows the users' real lengths; full or sampled softmax).
Amazon's P5 sequences carry no timestamps, so the relative bias is over positions only.

Dimension letters: B batch, L sequence length, D dim, H heads, V+1 items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from recsys.data.schema import PADDING_IDX
from recsys.modules.transformer import causal_segment_mask, left_padded_layout


@dataclass(frozen=True)
class HSTUConfig:
    num_items: int  # V; embeddings have V+1 rows, row 0 is padding
    max_len: int = 50  # most recent items the model reads
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 2
    dropout: float = 0.5  # on the input embeddings and every layer's output
    temperature: float = 0.05  # logits = cosine(user, item) / temperature


class HSTULayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, max_len: int, dropout: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads, self.max_len = num_heads, max_len
        self.in_norm = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.position_bias = nn.Parameter(torch.zeros(num_heads, max_len))  # per head, by distance back in time
        self.out_norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        """x (B, L, D), mask (B, 1, L, L) True = may attend, distance (B, L, L) query - key position -> (B, L, D)."""
        B, L, D = x.shape
        u, v, q, k = F.silu(self.uvqk(self.in_norm(x))).chunk(4, dim=-1)
        q, k, v = (t.view(B, L, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D/H)
        bias = self.position_bias[:, distance.clamp(0, self.max_len - 1)].transpose(0, 1)  # (B, H, L, L)
        weights = F.silu(q @ k.transpose(-1, -2) + bias) * mask / self.max_len
        y = (weights @ v).transpose(1, 2).reshape(B, L, D)
        return x + self.dropout(self.out(self.out_norm(y) * u))


class HSTU(nn.Module):
    """Causal HSTU sequential retriever; same inputs, outputs and scoring as `recsys.models.sasrec.SASRec`.

    Example:
        >>> model = HSTU(HSTUConfig(num_items=10, max_len=4, dim=8, num_heads=1))
        >>> model.eval().score(torch.tensor([[0, 3, 4, 5]])).shape
        torch.Size([1, 11])
    """

    def __init__(self, config: HSTUConfig) -> None:
        super().__init__()
        if config.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {config.temperature}")
        self.config = config
        self.item_emb = nn.Embedding(config.num_items + 1, config.dim, padding_idx=PADDING_IDX)
        self.pos_emb = nn.Embedding(config.max_len, config.dim)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            HSTULayer(config.dim, config.num_heads, config.max_len, config.dropout) for _ in range(config.num_layers)
        )
        nn.init.normal_(self.item_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        with torch.no_grad():
            self.item_emb.weight[PADDING_IDX].zero_()

    def forward(
        self, item_ids: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) item_idx [+ packed-row `segments` and `positions`, as SASRec] -> (B, L, D) user vectors,
        L2-normalised and divided by the temperature (so `@ item_embeddings().T` gives the logits)."""
        item_ids = item_ids.to(self.pos_emb.weight.device)
        if segments is None:
            item_ids, segments, positions = left_padded_layout(item_ids, self.config.max_len)
        elif positions is None:
            raise ValueError("packed rows need `positions` with `segments`")
        x = self.item_emb(item_ids) * math.sqrt(self.config.dim) + self.pos_emb(positions)
        x = self.emb_dropout(x) * (segments != 0)[..., None]
        mask = causal_segment_mask(segments)
        positions = positions.expand_as(item_ids)
        distance = positions[:, :, None] - positions[:, None, :]  # (B, L, L), >= 0 where the mask allows
        for layer in self.layers:
            x = layer(x, mask, distance)
        return F.normalize(x, dim=-1) / self.config.temperature

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) L2-normalised item vectors (output side; the input reads the raw embeddings)."""
        return F.normalize(self.item_emb.weight, dim=-1)

    def encode_queries(self, histories: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D) user vectors (last column)."""
        return self(histories)[:, -1]

    def score(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, V+1) logits over all items (`users` is ignored)."""
        return self.encode_queries(histories) @ self.item_embeddings().T
