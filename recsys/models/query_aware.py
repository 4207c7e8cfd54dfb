"""Query-aware sequential retrieval: one model for recommendation (a history), search (a text query) and both.

A SASRec reads the history; the query is embedded by the platform's content encoder (MiniLM, as the items' titles).
Two towers meet in a gated sum, one learned, one textual:

    item vector   e_i = [id_i + P(c_i) ; c_i / |c_i|]        c_i: the item's content embedding (C), P: C -> D
    user state    h   = SASRec(history)   (a learned `h_0` when there is no history; its inputs are id_i + P(c_i))
    query         q   = encoder(query text)
    fused         u   = [h + g * P(q) ; t * s * q / |q|]      g = sigmoid(W [h; P(q)] + b) per dimension,
                                                              t = sigmoid(w [h; P(q)] + b') one per row, s > 0 learned
                  u   = [h ; 0]                               without a query
    scores        u . e_i = (h + g * P(q)) . (id_i + P(c_i)) + t * s * cos(q, c_i)

The learned tower (the first D dimensions) carries the history and what P keeps of the query; the text tower (the
last C) is the cosine of the query and each title in the encoder's full space, which a D-dimensional projection
blurs (a query's exact words tell one title from its neighbours), weighted by a scale s and a gate t that the history
can lower. Every score stays one dot product, so the item vectors go into a FAISS index as any retriever's.
Without a query it is a SASRec with content-aware item vectors; without a history it is a text search over the
catalogue (h_0 + g * P(q), and the text tower). Trained on next items (`recsys.training.recipes.query_aware`):
each target is given, at random, one of its training queries (made from its title), and some positions lose their
history, so the model learns all three uses.

Dimension letters: B batch, L history length, D dim, C content (encoder) dim, V+1 items.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import NonNegativeInt, PositiveInt
from torch import nn

from recsys.data.times import HistoryTimes
from recsys.models import TrainingFamily
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.validation import Fraction, check_heads
from recsys.semantic_ids.content import DEFAULT_MODEL


@dataclass(frozen=True)
class QueryAwareConfig:
    num_items: int  # V
    max_history: PositiveInt = 50
    dim: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 2
    ffn_dim: PositiveInt = 256
    dropout: Fraction = 0.5
    attn_dropout: Fraction = 0.5
    content_dim: NonNegativeInt = 0  # C, filled in from the content embeddings by the registry
    # the encoder of queries at scoring time: the one that embedded the items' content (the experiment's
    # `sid.content.model`, filled in by the registry), recorded so that serving embeds queries the same way
    encoder: str = DEFAULT_MODEL

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)

    def backbone(self) -> SASRecConfig:
        return SASRecConfig(
            num_items=self.num_items, max_history=self.max_history, dim=self.dim, num_layers=self.num_layers,
            num_heads=self.num_heads, ffn_dim=self.ffn_dim, dropout=self.dropout, attn_dropout=self.attn_dropout,
        )  # fmt: skip


TEXT_SCALE_INIT = 10.0  # the text tower's starting scale s (module docstring)


class QueryAwareRetriever(nn.Module):
    """SASRec + a text query, a learned and a text tower fused by gates; scores every item by a dot product.

    Args:
        config: sizes, and the query encoder's name.
        content: (V+1, content_dim) the items' content embeddings, row 0 zero (None: from a state dict).

    Example:
        >>> model = QueryAwareRetriever(QueryAwareConfig(num_items=5, max_history=4, dim=8, num_heads=1, ffn_dim=16,
        ...                                              content_dim=3), torch.randn(6, 3))
        >>> model.eval().score(torch.tensor([[0, 1, 2]])).shape            # a history alone
        torch.Size([1, 6])
        >>> model.score_with_queries(torch.zeros(2, 0, dtype=torch.long), torch.randn(2, 3)).shape   # queries alone
        torch.Size([2, 6])
    """

    training_family: ClassVar[TrainingFamily] = "query_aware"

    def __init__(self, config: QueryAwareConfig, content: torch.Tensor | None = None) -> None:
        super().__init__()
        if config.content_dim < 1:
            raise ValueError("a query-aware model needs the items' content embeddings (content_dim >= 1)")
        self.config = config
        self.sasrec = SASRec(config.backbone())
        table = torch.zeros(config.num_items + 1, config.content_dim)
        if content is not None:
            table.copy_(content)
        self.content: torch.Tensor
        self.register_buffer("content", table)  # (V+1, C): saved with the model, which serving loads alone
        self.text = nn.Linear(config.content_dim, config.dim, bias=False)  # P: content and queries alike
        self.gate = nn.Linear(2 * config.dim, config.dim)
        self.no_history = nn.Parameter(torch.zeros(config.dim))  # h_0
        self.text_gate = nn.Linear(2 * config.dim, 1)  # t
        # s = softplus(.): starts at TEXT_SCALE_INIT, a cosine gap of 0.1 between two titles worth a logit of 1
        self.text_scale = nn.Parameter(torch.tensor(TEXT_SCALE_INIT).expm1().log())
        nn.init.normal_(self.text.weight, std=0.02)
        self._cache: dict[str, tuple[tuple[object, ...], torch.Tensor]] = {}  # `_inference_cached`'s

    @property
    def max_history(self) -> int:
        return self.config.max_history

    def input_embeddings(self) -> torch.Tensor:
        """(V+1, D) the history's item vectors: ID embedding + projected content (the learned tower's items)."""
        return self._inference_cached("input", lambda: self.sasrec.item_embeddings() + self.text(self.content))

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D+C) output item vectors: the learned tower's, then the unit content vector (the text tower's)."""
        return self._inference_cached(
            "output", lambda: torch.cat([self.input_embeddings(), F.normalize(self.content, dim=-1)], dim=-1)
        )

    def _inference_cached(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`compute()`, kept between calls without gradients until a parameter or buffer changes (an optimizer step
        or a load bumps its version): projecting V contents costs V * C * D flops, per call of every request."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # training, or inside a graph: no state
            return compute()
        tensors = [*self.parameters(), *self.buffers()]
        key = (torch.is_autocast_enabled(), *((t.data_ptr(), t._version) for t in tensors))
        cached = self._cache.get(name)
        if cached is None or cached[0] != key:
            cached = self._cache[name] = (key, compute())
        return cached[1]

    def forward(
        self, item_ids: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) items [+ packed `segments` and `positions`] -> (B, L, D) user states, no query (SASRec's)."""
        return self.sasrec(item_ids, segments, positions, items=self.input_embeddings())

    def fuse(self, states: torch.Tensor, queries: torch.Tensor, has_query: torch.Tensor) -> torch.Tensor:
        """(N, D) user states + (N, C) query embeddings -> (N, D+C) user vectors against `item_embeddings`; rows
        where `has_query` (N,) bool is False keep their state, and nothing in the text tower."""
        q = self.text(queries)  # (N, D)
        both = torch.cat([states, q], dim=-1)
        learned = torch.where(has_query[:, None], states + torch.sigmoid(self.gate(both)) * q, states)
        weight = torch.sigmoid(self.text_gate(both)) * F.softplus(self.text_scale)  # (N, 1): t * s
        text = torch.where(has_query[:, None], weight * F.normalize(queries, dim=-1), torch.zeros_like(queries))
        return torch.cat([learned, text], dim=-1)

    def without_query(self, states: torch.Tensor) -> torch.Tensor:
        """(N, D) user states -> (N, D+C) user vectors with an empty text tower."""
        return torch.cat([states, states.new_zeros(len(states), self.config.content_dim)], dim=-1)

    def without_history(self, count: int) -> torch.Tensor:
        """(count, D) the state of users with no history (h_0)."""
        return self.no_history.expand(count, -1)

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D+C) user vectors, no text query (the recommender's use)."""
        return self.without_query(self._states(histories))

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, V+1) scores over all items."""
        return self.encode_queries(histories) @ self.item_embeddings().T

    def score_with_queries(self, histories: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded histories (an all-padding row, or L = 0: no history) + (B, C) query embeddings ->
        (B, V+1) scores over all items."""
        states = self._states(histories)
        fused = self.fuse(states, queries.to(states), torch.ones(len(states), dtype=torch.bool, device=states.device))
        return fused @ self.item_embeddings().T

    def _states(self, histories: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D): the last position's state, h_0 for an empty history."""
        device = self.no_history.device
        empty = torch.ones(len(histories), dtype=torch.bool, device=device)
        if histories.shape[1]:
            empty = (histories.to(device) == 0).all(dim=1)
        if bool(empty.all()):
            return self.without_history(len(histories))
        states = self(histories)[:, -1]
        return torch.where(empty[:, None], self.without_history(len(histories)), states)

    def extra_repr(self) -> str:
        return f"encoder={self.config.encoder!r}"
