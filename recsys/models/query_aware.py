"""Query-aware sequential retrieval: one model for recommendation (a history), search (a text query) and both.

A SASRec reads the history; the query is embedded by the platform's content encoder (MiniLM, as the items' titles).
Three towers meet in a gated sum: a learned one, a textual one and a lexical one:

    item vector   e_i = [id_i + P(c_i) ; c_i / |c_i|]        c_i: the item's content embedding (C), P: C -> D
    user state    h   = SASRec(history)   (a learned `h_0` when there is no history; its inputs are id_i + P(c_i))
    query         q   = encoder(query text)
    fused         u   = [h + g * P(q) ; t * s * q / |q|]      g = sigmoid(W [h; P(q)] + b) per dimension,
                                                              t = sigmoid(w [h; P(q)] + b') one per row, s > 0 learned
                  u   = [h ; 0]                               without a query
    scores        u . e_i + l * r * BM25(query text, text_i)  l = sigmoid(w' [h; P(q)] + b'') one per row, r > 0
                                                              learned; 0 without a query

The learned tower (the first D dimensions) carries the history and what P keeps of the query; the text tower (the
last C) is the cosine of the query and each title in the encoder's full space, which a D-dimensional projection
blurs (a query's exact words tell one title from its neighbours), weighted by a scale s and a gate t that the history
can lower. The lexical tower (`lexical`, on by default) is BM25 of the query's words against each item's text
(`recsys.retrieval.lexical`, the items' texts saved with the model): a sentence encoder maps "acne wash" near every
cleanser, BM25 ranks the titles holding both words first; its weight l * r is learned as the others' (a specific
query can outweigh the history, a vague one not). BM25 is a sparse dot product (query words . each item's term
weights), computed beside the dense one; the dense part alone (a history without a query) goes into a FAISS index as
any retriever's. Without a query it is a SASRec with content-aware item vectors; without a history it is a text
search over the catalogue (h_0 + g * P(q), and the text and lexical towers). Trained on next items
(`recsys.training.recipes.query_aware`): each target is given, at random, one of its training queries (made from its
title), and some positions lose their history, so the model learns all three uses.

Dimension letters: B batch, L history length, D dim, C content (encoder) dim, V+1 items.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import NonNegativeInt, PositiveInt
from torch import nn

from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError, RecsysError
from recsys.models.family import (
    DEFAULT_MAX_HISTORY,
    Input,
    Model,
    ModelFamily,
    ModelInputs,
    content_of,
    required,
)
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.modules.inference_cache import InferenceCache
from recsys.retrieval.lexical import BM25Retriever
from recsys.runtime.validation import Fraction, check_heads
from recsys.semantic_ids.content import DEFAULT_MODEL


@dataclass(frozen=True)
class QueryAwareConfig:
    num_items: int  # V
    max_history: PositiveInt = DEFAULT_MAX_HISTORY
    dim: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 2
    ffn_dim: PositiveInt = 256
    dropout: Fraction = 0.5
    attn_dropout: Fraction = 0.5
    content_dim: NonNegativeInt = 0  # C, filled in from the content embeddings by the registry
    # the encoder of queries at scoring time: the one that embedded the items' content (the experiment's
    # `content.model`, filled in when the model is built), recorded so that serving embeds queries the same way
    encoder: str = DEFAULT_MODEL
    lexical: bool = True  # the lexical tower: BM25 of the query against the items' texts (module docstring)

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)

    def backbone(self) -> SASRecConfig:
        return SASRecConfig(
            num_items=self.num_items, max_history=self.max_history, dim=self.dim, num_layers=self.num_layers,
            num_heads=self.num_heads, ffn_dim=self.ffn_dim, dropout=self.dropout, attn_dropout=self.attn_dropout,
        )  # fmt: skip


TEXT_SCALE_INIT = 10.0  # the text tower's starting scale s (module docstring)
LEXICAL_SCALE_INIT = 1.0  # the lexical tower's starting scale r: a BM25 point worth a logit


class LexicalTower(nn.Module):
    """BM25 scores of text queries against every item's text, the texts kept in the model's state dict (its extra
    state), so that a saved model searches as it was trained without the catalogue beside it.

    Args:
        texts: (V,) the text of items 1..V (`recsys.semantic_ids.content.item_texts` of the items sorted by index),
            or None: filled in by `load_state_dict`.
    """

    def __init__(self, texts: Sequence[str] | None = None) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.bm25: BM25Retriever | None = None
        if texts is not None:
            self.index(texts)

    def index(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)
        self.bm25 = BM25Retriever(self.texts)

    def scores(self, queries: Sequence[str]) -> torch.Tensor:
        """(B,) non-empty query texts -> (B, V+1) float32 BM25 scores, column 0 (the padding) 0."""
        if self.bm25 is None:
            raise RecsysError(
                "the query-aware model's lexical tower holds no item texts. Fix: build the model with the items' "
                "texts (ModelInputs.item_texts, as the pipeline's train step does), or load a trained model"
            )
        scores = self.bm25.score(queries)
        scores[:, 0] = 0.0
        return scores

    def get_extra_state(self) -> dict[str, list[str]]:
        return {"texts": self.texts}

    def set_extra_state(self, state: dict[str, list[str]]) -> None:
        self.index(state["texts"])

    def extra_repr(self) -> str:
        return f"items={len(self.texts)}"


class QueryAwareRetriever(Model[QueryAwareConfig]):
    """SASRec + a text query, a learned and a text tower fused by gates; scores every item by a dot product.

    Args:
        config: sizes, and the query encoder's name.
        content: (V+1, content_dim) the items' content embeddings, row 0 zero (None: from a state dict).
        texts: (V,) the texts of items 1..V, which the lexical tower indexes (None: from a state dict).

    Example:
        >>> titles = ["red lipstick", "blue eye shadow", "lipstick brush", "nail polish", "face cream"]
        >>> model = QueryAwareRetriever(QueryAwareConfig(num_items=5, max_history=4, dim=8, num_heads=1, ffn_dim=16,
        ...                                              content_dim=3), torch.randn(6, 3), titles)
        >>> model.eval().score(torch.tensor([[0, 1, 2]])).shape            # a history alone
        torch.Size([1, 6])
        >>> no_history = torch.zeros(2, 0, dtype=torch.long)
        >>> model.score_with_queries(no_history, torch.randn(2, 3), ["lipstick", "cream"]).shape   # queries alone
        torch.Size([2, 6])
    """

    def __init__(
        self, config: QueryAwareConfig, content: torch.Tensor | None = None, texts: Sequence[str] | None = None
    ) -> None:
        if config.content_dim < 1:
            raise ValueError("a query-aware model needs the items' content embeddings (content_dim >= 1)")
        super().__init__(config)
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
        self.lexical = LexicalTower(texts) if config.lexical else None
        self.lexical_gate = nn.Linear(2 * config.dim, 1) if config.lexical else None  # l
        # r = softplus(.), as s
        self.lexical_scale = nn.Parameter(torch.tensor(LEXICAL_SCALE_INIT).expm1().log()) if config.lexical else None
        nn.init.normal_(self.text.weight, std=0.02)
        self._cache = InferenceCache()

    @property
    def max_history(self) -> int:
        return self.config.max_history

    @property
    def query_encoder(self) -> str:
        """The content encoder that embeds its queries (`recsys.inference.QueryScorer`)."""
        return self.config.encoder

    def input_embeddings(self) -> torch.Tensor:
        """(V+1, D) the history's item vectors: ID embedding + projected content (the learned tower's items)."""
        return self._inference_cached("input", lambda: self.sasrec.item_embeddings() + self.text(self.content))

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D+C) output item vectors: the learned tower's, then the unit content vector (the text tower's)."""
        return self._inference_cached(
            "output", lambda: torch.cat([self.input_embeddings(), F.normalize(self.content, dim=-1)], dim=-1)
        )

    def _inference_cached(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`compute()`, kept between calls without gradients until a parameter or buffer changes: projecting V
        contents costs V * C * D flops, per call of every request."""
        return self._cache.get(name, compute, reads=[*self.parameters(), *self.buffers()])

    def forward(
        self, item_ids: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) items [+ packed `segments` and `positions`] -> (B, L, D) user states, no query (SASRec's)."""
        return self.sasrec(item_ids, segments, positions, items=self.input_embeddings())

    def fuse(
        self, states: torch.Tensor, queries: torch.Tensor, has_query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, D) user states + (N, C) query embeddings -> ((N, D+C) user vectors against `item_embeddings`, (N, 1)
        the lexical tower's weight l * r); rows where `has_query` (N,) bool is False keep their state, and nothing
        in the text and lexical towers (weight 0, as without the tower)."""
        q = self.text(queries)  # (N, D)
        both = torch.cat([states, q], dim=-1)
        learned = torch.where(has_query[:, None], states + torch.sigmoid(self.gate(both)) * q, states)
        weight = torch.sigmoid(self.text_gate(both)) * F.softplus(self.text_scale)  # (N, 1): t * s
        text = torch.where(has_query[:, None], weight * F.normalize(queries, dim=-1), torch.zeros_like(queries))
        lexical = torch.zeros_like(weight)
        if self.lexical_gate is not None and self.lexical_scale is not None:
            lexical = torch.sigmoid(self.lexical_gate(both)) * F.softplus(self.lexical_scale)  # (N, 1): l * r
            lexical = torch.where(has_query[:, None], lexical, 0.0)
        return torch.cat([learned, text], dim=-1), lexical

    def lexical_scores(self, texts: Sequence[str], has_query: torch.Tensor) -> torch.Tensor | None:
        """(N,) query texts ("" where `has_query` (N,) bool is False) -> (N, V+1) BM25 scores, 0 in rows without a
        query; None for a model without the lexical tower."""
        if self.lexical is None:
            return None
        rows = has_query.nonzero().flatten().cpu()
        scores = torch.zeros(len(texts), self.config.num_items + 1)
        if len(rows):
            scores[rows] = self.lexical.scores([texts[row] for row in rows.tolist()])
        return scores.to(has_query.device)

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

    def score_with_queries(
        self, histories: torch.Tensor, queries: torch.Tensor, texts: Sequence[str] | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories (an all-padding row, or L = 0: no history) + (B, C) query embeddings and
        their (B,) non-empty texts (which the lexical tower reads; None only for a model without it) -> (B, V+1)
        scores over all items."""
        states = self._states(histories)
        has_query = torch.ones(len(states), dtype=torch.bool, device=states.device)
        fused, weight = self.fuse(states, queries.to(states), has_query)
        scores = fused @ self.item_embeddings().T
        if self.lexical is None:
            return scores
        if texts is None or len(texts) != len(states):
            raise ValueError(
                f"the lexical tower reads each query's text: got {'none' if texts is None else len(texts)} for "
                f"{len(states)} queries. Fix: pass the texts the query embeddings were made from"
            )
        return scores + weight * self.lexical.scores(texts).to(scores)  # every row has a query

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


def _build(fields: dict[str, Any], inputs: ModelInputs) -> QueryAwareRetriever:
    content = content_of(inputs, fields["num_items"])
    encoder = required(
        inputs.content_encoder,
        "model 'query_aware' embeds queries with the items' content encoder, and none is known. Fix: build it "
        "through the pipeline, whose embed_content step names it",
    )
    config = FAMILY.validate({**fields, "content_dim": content.shape[1], "encoder": encoder})
    if not config.lexical:
        return QueryAwareRetriever(config, content)
    texts = required(
        inputs.item_texts,
        "model 'query_aware' with its lexical tower (model.params.lexical) indexes the items' texts. Fix: build it "
        "through the pipeline, or pass ModelInputs.item_texts",
    )
    if len(texts) != config.num_items:
        raise ConfigError(f"{len(texts)} item texts for {config.num_items} items. Fix: one text per item, by index")
    return QueryAwareRetriever(config, content, texts)


def _reads(config: QueryAwareConfig) -> frozenset[Input]:
    return frozenset({Input.CONTENT, Input.QUERIES, *([Input.ITEM_TEXTS] if config.lexical else [])})


FAMILY = ModelFamily(
    "query_aware", QueryAwareConfig, QueryAwareRetriever, _build, training="queries", reads=_reads,
    filled={"num_items": 1, "content_dim": 1, "encoder": ""},
)  # fmt: skip
