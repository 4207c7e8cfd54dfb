"""HSTU (Zhai et al., ICML 2024, "Actions Speak Louder than Words"): hierarchical sequential transduction units.

Each layer replaces softmax attention + feed-forward by one gated unit:
    U, V, Q, K = split(SiLU(W1 LayerNorm(x)))
    A          = SiLU(Q K^T + relative bias) / max_history, causal within each user's run
    x         <- x + W2 (LayerNorm(A V) * U)
The relative bias is learned per head over how far back the key is (positions) and, with `num_time_buckets`,
over how long before the prediction it happened, as in the paper: position i predicts item i+1, so its query
time is item i+1's time (training) or the request's (scoring: now when serving, the held-out item's time in
leave-one-out evaluation), and the bias reads log2-spaced buckets of query time - ts(key). "Back within minutes"
and "back after three weeks" then weigh the same history differently.
The pointwise SiLU (no softmax) keeps the strength of a preference instead of normalising it away. Outputs and
item vectors are L2-normalised and the logits divided by a temperature, as in the paper's retrieval configs.
Training and scoring follow SASRec (packed rows: compute follows the users' real lengths; full or sampled softmax).
Amazon's P5 sequences carry no timestamps (their `ts` is the position), so their configs use positions only.

Dimension letters: B batch, L sequence length, D dim, H heads, V+1 items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import NonNegativeInt, PositiveFloat, PositiveInt
from torch import nn

from recsys.data.schema import PADDING_IDX
from recsys.data.times import HistoryTimes
from recsys.models import TrainingFamily
from recsys.modules.transformer import causal_segment_mask, left_padded_layout
from recsys.runtime.validation import Fraction, check_heads


@dataclass(frozen=True)
class HSTUConfig:
    num_items: int  # V; embeddings have V+1 rows, row 0 is padding
    max_history: PositiveInt = 50  # most recent items the model reads
    dim: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 2
    dropout: Fraction = 0.5  # on the input embeddings and every layer's output
    temperature: PositiveFloat = 0.05  # logits = cosine(user, item) / temperature
    # > 0: relative bias over log2 buckets of time gaps too (needs real timestamps)
    num_time_buckets: NonNegativeInt = 0

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)


def time_buckets(gaps: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Time gaps in seconds -> bucket ids in [0, num_buckets): 0 for gaps under 1 s, then one bucket per doubling
    (1 s, 2-3 s, 4-7 s, ...), the last one open-ended. Negative gaps (keys after the query, masked) map to 0.

    Example:
        >>> time_buckets(torch.tensor([0, 1, 3, 4, 3600, 10**9]), 8).tolist()
        [0, 1, 2, 3, 7, 7]
    """
    doublings = torch.floor(torch.log2(gaps.clamp(min=1).double())).long() + 1
    return torch.where(gaps >= 1, doublings, 0).clamp(max=num_buckets - 1)


class HSTULayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, max_len: int, dropout: float, num_time_buckets: int = 0) -> None:
        super().__init__()
        self.num_heads, self.max_len = num_heads, max_len
        self.in_norm = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.position_bias = nn.Parameter(torch.zeros(num_heads, max_len))  # per head, by distance back in time
        # per head, by time-gap bucket; None without time buckets
        self.time_bias = nn.Parameter(torch.zeros(num_heads, num_time_buckets)) if num_time_buckets else None
        self.out_norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, distance: torch.Tensor, gap_bucket: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (B, L, D), mask (B, 1, L, L) True = may attend, distance (B, L, L) query - key position,
        gap_bucket (B, L, L) time-gap bucket of every (query, key) pair (with time buckets) -> (B, L, D)."""
        B, L, D = x.shape
        u, v, q, k = F.silu(self.uvqk(self.in_norm(x))).chunk(4, dim=-1)
        q, k, v = (t.view(B, L, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D/H)
        bias = self.position_bias[:, distance.clamp(0, self.max_len - 1)].transpose(0, 1)  # (B, H, L, L)
        if self.time_bias is not None:
            assert gap_bucket is not None
            bias = bias + self.time_bias[:, gap_bucket].transpose(0, 1)
        weights = F.silu(q @ k.transpose(-1, -2) + bias) * mask / self.max_len
        y = (weights @ v).transpose(1, 2).reshape(B, L, D)
        return x + self.dropout(self.out(self.out_norm(y) * u))


class HSTU(nn.Module):
    """Causal HSTU sequential retriever; same inputs, outputs and scoring as `recsys.models.sasrec.SASRec`.

    Example:
        >>> model = HSTU(HSTUConfig(num_items=10, max_history=4, dim=8, num_heads=1))
        >>> model.eval().score(torch.tensor([[0, 3, 4, 5]])).shape
        torch.Size([1, 11])
    """

    training_family: ClassVar[TrainingFamily] = "next_item"

    def __init__(self, config: HSTUConfig) -> None:
        super().__init__()
        self.config = config
        self.item_emb = nn.Embedding(config.num_items + 1, config.dim, padding_idx=PADDING_IDX)
        self.pos_emb = nn.Embedding(config.max_history, config.dim)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            HSTULayer(config.dim, config.num_heads, config.max_history, config.dropout, config.num_time_buckets)
            for _ in range(config.num_layers)
        )
        nn.init.normal_(self.item_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        with torch.no_grad():
            self.item_emb.weight[PADDING_IDX].zero_()

    @property
    def reads_timestamps(self) -> bool:
        return self.config.num_time_buckets > 0

    def forward(
        self,
        item_ids: torch.Tensor,
        segments: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        timestamps: torch.Tensor | None = None,
        query_times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) item_idx [+ packed-row `segments` and `positions`, as SASRec] [+ (B, L) `timestamps` of the items and
        (B, L) `query_times`, the moment each position predicts for; both needed with time buckets] -> (B, L, D) user
        vectors, L2-normalised and divided by the temperature (so `@ item_embeddings().T` gives the logits)."""
        device = self.pos_emb.weight.device
        item_ids = item_ids.to(device)
        if self.reads_timestamps and (timestamps is None or query_times is None):
            raise ValueError(
                f"this HSTU has num_time_buckets={self.config.num_time_buckets}: pass the history's times "
                "(`times` when scoring; `timestamps` and `query_times` to forward)"
            )
        if segments is None:
            if timestamps is not None and query_times is not None:
                timestamps, query_times = (
                    timestamps[:, -self.config.max_history :],
                    query_times[:, -self.config.max_history :],
                )
            item_ids, segments, positions = left_padded_layout(item_ids, self.config.max_history)
        elif positions is None:
            raise ValueError("packed rows need `positions` with `segments`")
        x = self.item_emb(item_ids) * math.sqrt(self.config.dim) + self.pos_emb(positions)
        x = self.emb_dropout(x) * (segments != 0)[..., None]
        mask = causal_segment_mask(segments)
        positions = positions.expand_as(item_ids)
        distance = positions[:, :, None] - positions[:, None, :]  # (B, L, L), >= 0 where the mask allows
        gap_bucket = None
        if self.reads_timestamps:
            assert timestamps is not None and query_times is not None
            gaps = query_times.to(device)[:, :, None] - timestamps.to(device)[:, None, :]  # (B, L, L)
            gap_bucket = time_buckets(gaps, self.config.num_time_buckets)
        for layer in self.layers:
            x = layer(x, mask, distance, gap_bucket)
        return F.normalize(x, dim=-1) / self.config.temperature

    @property
    def max_history(self) -> int:
        return self.config.max_history

    def use_sparse_item_gradients(self) -> bool:
        """Make the ID table's gradient row-sparse (its rows read by a step; SparseAdam then updates those alone)."""
        self.item_emb.sparse = True
        return True

    def item_rows(self, items: torch.Tensor) -> torch.Tensor:
        """(..., D) the vectors of `items`, as `item_embeddings()[items]`, normalised row by row."""
        return F.normalize(self.item_emb(items), dim=-1)

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) L2-normalised item vectors (output side; the input reads the raw embeddings)."""
        return F.normalize(self.item_emb.weight, dim=-1)

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories [+ their and the request's `times`] -> (B, D) user vectors (last column; `users`
        is ignored, `times` only count with time buckets)."""
        if times is None:
            return self(histories)[:, -1]
        return self(histories, timestamps=times.items, query_times=times.next_times())[:, -1]

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories [+ their and the request's `times`] -> (B, V+1) logits over all items (`users`
        is ignored; `times` only count with time buckets)."""
        return self.encode_queries(histories, users, times) @ self.item_embeddings().T
