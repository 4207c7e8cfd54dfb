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

Attention takes one of two paths to the same function (`attention_kernel`): "torch" masks a dense (B, H, L, L)
computation over whole rows; "triton" (the default on CUDA) makes every user's run one jagged sequence for the
fused kernel of `recsys.ops.hstu_attention`, whose work follows the runs' lengths.

Dimension letters: B batch, L sequence length, D dim, H heads, V+1 items, N = B*L tokens, S run slots (= N).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from torch import nn

from recsys.data.schema import PADDING_IDX
from recsys.data.times import HistoryTimes
from recsys.models.family import (
    DEFAULT_MAX_HISTORY,
    Input,
    Model,
    ModelFamily,
    ModelInputs,
    content_of,
    item_counts_of,
)
from recsys.modules.content_items import ContentFirstItems
from recsys.modules.inference_cache import InferenceCache
from recsys.modules.transformer import causal_segment_mask, left_padded_layout, most_recent
from recsys.ops.hstu_attention import Kernel, hstu_attention, select_kernel
from recsys.ops.hstu_attention import time_buckets as time_buckets  # its home is the op; models read it here too
from recsys.runtime.validation import Fraction, check_heads


@dataclass(frozen=True)
class HSTUConfig:
    num_items: int  # V; embeddings have V+1 rows, row 0 is padding
    max_history: PositiveInt = DEFAULT_MAX_HISTORY  # most recent items the model reads
    dim: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 2
    dropout: Fraction = 0.5  # on the input embeddings and every layer's output
    temperature: PositiveFloat = 0.05  # logits = cosine(user, item) / temperature
    # > 0: relative bias over log2 buckets of time gaps too (needs real timestamps)
    num_time_buckets: NonNegativeInt = 0
    # attention backend: "auto" = the Triton kernel on CUDA when Triton is installed, else "torch" (the dense masked
    # path); "triton" runs the users' runs as jagged sequences (recsys.ops.hstu_attention)
    attention_kernel: Literal["auto", "torch", "triton"] = "auto"
    # items = MLP(content embedding) + an ID residual kept in training with probability count / (count +
    # residual_half_count), as SASRec's (recsys.modules.content_items): items never trained get their text's vector
    content_first: bool = False
    residual_half_count: NonNegativeFloat = 10.0
    content_dim: NonNegativeInt = 0  # C, filled in from the content embeddings when content_first

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)
        if self.content_first and self.content_dim < 1:
            raise ValueError("content_first needs the items' content embeddings (content_dim >= 1)")


@dataclass(frozen=True)
class JaggedRuns:
    """The users' runs of (B, L) rows as jagged sequences over the N = B*L tokens reordered by `order`: real tokens
    first (row by row, each run contiguous), padding after them; sequence t is the run starting at token t (empty
    for the other tokens), so offsets[-1] = the number of real tokens and the padding belongs to no sequence."""

    order: torch.Tensor  # (N,) int64: the token of the rows at each jagged place
    offsets: torch.Tensor  # (S+1,) int64, S = N
    max_seq_len: int  # L: no run is longer than a row
    timestamps: torch.Tensor | None = None  # (N,) int64 in jagged order, with time buckets
    query_times: torch.Tensor | None = None  # (N,) int64 in jagged order, with time buckets

    @staticmethod
    def of(segments: torch.Tensor) -> JaggedRuns:
        """From (B, L) run ids (0 = padding); each run's tokens are consecutive in its row (packing and left
        padding give that). Fixed shapes throughout: no device sync, nothing data-dependent for torch.compile.

        Example:
            >>> runs = JaggedRuns.of(torch.tensor([[1, 1, 2, 0], [0, 1, 1, 1]]))
            >>> runs.order.tolist()   # runs [0 1] [2] [5 6 7], then the padding
            [0, 1, 2, 5, 6, 7, 3, 4]
            >>> runs.offsets.tolist()   # sequences start at places 0, 2 and 3; the others are empty
            [0, 2, 2, 3, 6, 6, 6, 6, 6]
        """
        flat = segments.flatten()  # (N,)
        real = flat != 0
        order = torch.sort((~real).to(torch.uint8), stable=True).indices  # real tokens first, in row order
        seg, row = flat[order], order // segments.shape[1]
        place = torch.arange(flat.numel(), device=flat.device)
        new_run = (seg != seg.roll(1)) | (row != row.roll(1)) | (place == 0)  # (N,)
        num_real = real.sum()
        # offsets[t] = the first run start at or after place t (num_real past the last): a reversed running minimum
        starts = torch.where(real[order] & new_run, place, num_real)
        next_start = starts.flip(0).cummin(0).values.flip(0)  # (N,)
        return JaggedRuns(order, torch.cat([next_start, num_real[None]]), segments.shape[1])

    def with_times(self, timestamps: torch.Tensor, query_times: torch.Tensor) -> JaggedRuns:
        """The runs with the (B, L) times of their keys and queries, reordered alike."""
        return dataclasses.replace(
            self, timestamps=timestamps.flatten()[self.order], query_times=query_times.flatten()[self.order]
        )


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
        return self._gated(x, y, u)

    def forward_jagged(self, x: torch.Tensor, runs: JaggedRuns, kernel: Kernel | None) -> torch.Tensor:
        """x (N, D) tokens in `runs`' order -> (N, D), attention within each run by `kernel` (None: by availability).
        Padding tokens (past runs.offsets[-1]) get zero attention outputs: theirs are never read."""
        N, D = x.shape
        u, v, q, k = F.silu(self.uvqk(self.in_norm(x))).chunk(4, dim=-1)  # (N, D) each, views of one (N, 4D)
        q, k, v = (t.view(N, self.num_heads, D // self.num_heads) for t in (q, k, v))  # (N, H, D/H), strided
        y = hstu_attention(
            q, k, v, runs.offsets, max_len=self.max_len, position_bias=self.position_bias, time_bias=self.time_bias,
            timestamps=runs.timestamps, query_times=runs.query_times, max_seq_len=runs.max_seq_len, kernel=kernel,
        )  # fmt: skip
        return self._gated(x, y.reshape(N, D), u)

    def _gated(self, x: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """x + W2 (LayerNorm(y) * u), dropout on the branch; any leading dims."""
        return x + self.dropout(self.out(self.out_norm(y) * u))


class HSTU(Model[HSTUConfig]):
    """Causal HSTU sequential retriever; same inputs, outputs and scoring as `recsys.models.sasrec.SASRec`.

    Example:
        >>> model = HSTU(HSTUConfig(num_items=10, max_history=4, dim=8, num_heads=1))
        >>> model.eval().score(torch.tensor([[0, 3, 4, 5]])).shape
        torch.Size([1, 11])
    """

    def __init__(
        self, config: HSTUConfig, content: torch.Tensor | None = None, counts: torch.Tensor | None = None
    ) -> None:
        """Args: config; content (V+1, content_dim) embeddings and counts (V+1,) training counts when `content_first`
        (None: from a state dict)."""
        super().__init__(config)
        self.item_emb = (
            None if config.content_first else nn.Embedding(config.num_items + 1, config.dim, padding_idx=PADDING_IDX)
        )
        self.content_items = (
            ContentFirstItems.of_size(
                config.num_items, config.content_dim, config.dim, config.residual_half_count, content, counts
            )
            if config.content_first
            else None
        )
        self.pos_emb = nn.Embedding(config.max_history, config.dim)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.attention_kernel = None if config.attention_kernel == "auto" else Kernel(config.attention_kernel)
        self.layers = nn.ModuleList(
            HSTULayer(config.dim, config.num_heads, config.max_history, config.dropout, config.num_time_buckets)
            for _ in range(config.num_layers)
        )
        self._normalised = InferenceCache()  # `item_embeddings`' table
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        if self.item_emb is not None:
            nn.init.normal_(self.item_emb.weight, std=0.02)
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
                timestamps = most_recent(timestamps, self.config.max_history)
                query_times = most_recent(query_times, self.config.max_history)
            item_ids, segments, positions = left_padded_layout(item_ids, self.config.max_history)
        elif positions is None:
            raise ValueError("packed rows need `positions` with `segments`")
        x = self._input_rows(item_ids) * math.sqrt(self.config.dim) + self.pos_emb(positions)
        x = self.emb_dropout(x) * (segments != 0)[..., None]
        if select_kernel(self.attention_kernel, device) is Kernel.TRITON:
            x = self._jagged_layers(x, segments, timestamps, query_times)
        else:
            x = self._dense_layers(x, segments, positions, timestamps, query_times)
        return F.normalize(x, dim=-1) / self.config.temperature

    def _dense_layers(
        self,
        x: torch.Tensor,
        segments: torch.Tensor,
        positions: torch.Tensor,
        timestamps: torch.Tensor | None,
        query_times: torch.Tensor | None,
    ) -> torch.Tensor:
        """x (B, L, D) through the layers with masked dense attention over whole rows -> (B, L, D)."""
        device = x.device
        mask = causal_segment_mask(segments)
        positions = positions.expand_as(segments)
        distance = positions[:, :, None] - positions[:, None, :]  # (B, L, L), >= 0 where the mask allows
        gap_bucket = None
        if self.reads_timestamps:
            assert timestamps is not None and query_times is not None
            gaps = query_times.to(device)[:, :, None] - timestamps.to(device)[:, None, :]  # (B, L, L)
            gap_bucket = time_buckets(gaps, self.config.num_time_buckets)
        for layer in self.layers:
            x = layer(x, mask, distance, gap_bucket)
        return x

    def _jagged_layers(
        self, x: torch.Tensor, segments: torch.Tensor, timestamps: torch.Tensor | None, query_times: torch.Tensor | None
    ) -> torch.Tensor:
        """x (B, L, D) through the layers with each run a jagged sequence -> (B, L, D). Runs hold consecutive
        positions, so distances inside a run are the positions' differences, as on the dense path."""
        B, L, D = x.shape
        runs = JaggedRuns.of(segments)
        if self.reads_timestamps:
            assert timestamps is not None and query_times is not None
            runs = runs.with_times(timestamps.to(x.device), query_times.to(x.device))
        h = x.flatten(0, 1)[runs.order]  # (N, D)
        for layer in self.layers:
            assert isinstance(layer, HSTULayer)  # for mypy: a ModuleList holds Modules
            h = layer.forward_jagged(h, runs, self.attention_kernel)
        return torch.empty_like(h).index_copy(0, runs.order, h).view(B, L, D)  # back to the rows

    @property
    def max_history(self) -> int:
        return self.config.max_history

    def item_id_table(self) -> nn.Embedding | None:
        """The ID table when it alone is the items' vectors (`recsys.training.capabilities.ItemIdTable`); None when
        they are content-first."""
        return self.item_emb

    def replace_item_id_table(self, table: nn.Embedding) -> None:
        self.item_emb = table

    def item_rows(self, items: torch.Tensor) -> torch.Tensor:
        """(..., D) the vectors of `items`, as `item_embeddings()[items]`, normalised row by row."""
        return F.normalize(self._input_rows(items), dim=-1)

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) L2-normalised item vectors (output side; the input reads the raw embeddings); without gradients,
        normalised once per state of the weights (`InferenceCache`), not once per call; in training every call (a
        content-first table draws its residuals afresh)."""
        if self.training:
            return self._normalised_items()
        source = self.item_emb if self.item_emb is not None else self.content_items
        assert source is not None, "an HSTU has an ID table or content-first items"
        return self._normalised.get("items", self._normalised_items, reads=[*source.parameters(), *source.buffers()])

    def _normalised_items(self) -> torch.Tensor:
        return F.normalize(self.item_emb.weight if self.item_emb is not None else self._content_table(), dim=-1)

    def _input_rows(self, items: torch.Tensor) -> torch.Tensor:
        """(...,) item_idx -> (..., D) their raw vectors: ID embeddings, or content-first vectors."""
        return self.item_emb(items) if self.item_emb is not None else self._content_table()[items]

    def _content_table(self) -> torch.Tensor:
        assert self.content_items is not None, "an HSTU has an ID table or content-first items"
        return self.content_items()

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


def _build(fields: dict[str, Any], inputs: ModelInputs) -> HSTU:
    if not fields.get("content_first"):
        return HSTU(FAMILY.validate(fields))
    content = content_of(inputs, fields["num_items"])
    config = FAMILY.validate({**fields, "content_dim": content.shape[1]})
    return HSTU(config, content, item_counts_of(inputs, FAMILY.name, config.num_items))


def _reads(config: HSTUConfig) -> frozenset[Input]:
    return frozenset({Input.CONTENT, Input.ITEM_COUNTS} if config.content_first else ())


# its content embeddings and counts come with the state dict
FAMILY = ModelFamily(
    "hstu", HSTUConfig, HSTU, _build, training="next_item", reads=_reads, filled={"num_items": 1, "content_dim": 1}
)
