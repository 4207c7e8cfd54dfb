"""How a served model ranks, chosen once when its bundle loads: what the model can do (`Capabilities`, the one place
serving asks), and the ranking path of its histories (`HistoryRanking`: the library's full ranking, over the model's
own items, a content-first model's item table, or the requested domains; or its index, for a large catalogue).

Every exact path ranks through `recsys.inference` (`recommend`, `rank_scores`): masking, exclusion and ties (equal
scores in item id order) are the offline evaluation's own.

Dimension letters: B requests, L history length, V+1 items (0 = padding; V+1+N with N items added at run time),
D vector dim, k list length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from recsys.data.jagged import Jagged
from recsys.data.times import HistoryTimes
from recsys.inference import ContentItemScorer, DomainScorer, QueryScorer, Scorer, VectorScorer, padded_width, recommend
from recsys.retrieval import TopK

Ranked = list[tuple[list[int], list[float]]]  # each request's (item_idx, scores), best first


@dataclass(frozen=True)
class RequestTimes:
    """The times a time-aware model reads: of every history item, and of each request."""

    histories: Jagged  # (B,) rows aligned with the histories: unix seconds
    requests: torch.Tensor  # (B,) unix seconds


@dataclass(frozen=True)
class RankingRequests:
    """A batch of history requests, one row each, as every ranking path reads them."""

    histories: Jagged  # (B,) item_idx, oldest first
    exclude: torch.Tensor  # (B,) bool: drop each request's history items from its list
    domains: list[int]  # (B,) requested domain index (-1: the history's own)
    users: torch.Tensor  # (B,) known users' user_idx (0: unknown); models trained with user tokens read them
    times: RequestTimes | None = None  # time-aware models only

    def __len__(self) -> int:
        return len(self.histories)


@dataclass(frozen=True)
class Capabilities:
    """What the served model can do beyond scoring, each as the model typed by that capability (None: it cannot)."""

    vectors: VectorScorer | None  # item vectors: similar items, an index
    content: ContentItemScorer | None  # item vectors from content: items added at run time
    queries: QueryScorer | None  # text queries beside (or instead of) a history
    domains: DomainScorer | None  # several domains: a request may name one

    @staticmethod
    def of(model: Any) -> Capabilities:
        content = model if isinstance(model, ContentItemScorer) and model.content_encoder else None
        return Capabilities(
            vectors=model if isinstance(model, VectorScorer) else None,
            content=content,
            queries=model if isinstance(model, QueryScorer) else None,
            domains=model if isinstance(model, DomainScorer) else None,
        )


class HistoryRanking(Protocol):
    """Each request's top k from its history."""

    def top_k(self, requests: RankingRequests, k: int) -> Ranked:
        """Each request's top k (k: the most items any of them asked)."""
        ...


class FullRanking:
    """Every item scored by `scorer` and ranked as evaluation ranks (`recsys.inference.recommend`); a model of several
    domains scores each request in the domain it names."""

    def __init__(self, scorer: Scorer, domains: DomainScorer | None = None) -> None:
        self.scorer, self.domains = scorer, domains

    def top_k(self, requests: RankingRequests, k: int) -> Ranked:
        scorer = self.scorer
        if self.domains is not None and any(d >= 0 for d in requests.domains):
            scorer = _RequestedDomains(self.domains, torch.tensor(requests.domains))
        times = requests.times
        when, at = (None, None) if times is None else (times.histories, times.requests)
        scores, items = recommend(scorer, requests.histories, k, requests.exclude, requests.users, when, at)
        return [(items[row].tolist(), scores[row].tolist()) for row in range(len(requests))]


# (B, L) histories, (B,) user_idx, their times -> (B, D) user vectors
QueryEncoder = Callable[[torch.Tensor, torch.Tensor, HistoryTimes | None], torch.Tensor]


class IndexRanking:
    """A catalogue too large to rank whole per request: each history's user vector searched in the index, its own
    items dropped where asked (the search asks for that many more). Approximate, as the index is (its build report
    has its recall)."""

    def __init__(self, encode: QueryEncoder, index: TopK, max_history: int) -> None:
        self.encode, self.index, self.max_history = encode, index, max_history

    def top_k(self, requests: RankingRequests, k: int) -> Ranked:
        histories, exclude, times = requests.histories, requests.exclude, requests.times
        width = padded_width(histories, self.max_history)
        when = None if times is None else HistoryTimes(times.histories.to_padded(width), times.requests)
        queries = self.encode(histories.to_padded(width), requests.users, when).float()
        extra = int(histories.lengths().max()) if bool(exclude.any()) else 0
        scores, ids = self.index.search(queries, min(k + extra, self.index.num_items))
        found = []
        for row in range(len(requests)):
            skip = {-1, *histories.row(row).tolist()} if bool(exclude[row]) else {-1}  # -1: fewer found than asked
            kept = [(int(i), float(v)) for i, v in zip(ids[row], scores[row], strict=True) if int(i) not in skip]
            found.append(([i for i, _ in kept[:k]], [v for _, v in kept[:k]]))
        return found


def ranking_for(
    capabilities: Capabilities, model: Scorer, item_table: torch.Tensor | None, index: TopK | None
) -> HistoryRanking:
    """The history ranking of a served model: through `index` when given (a large catalogue of a one-domain model
    with item vectors), else the full ranking over the model's items, or over `item_table` (a content-first model's
    catalogue and run-time items)."""
    content, vectors = capabilities.content, capabilities.vectors
    if item_table is not None:
        assert content is not None, "an item table is a content-first model's"
        if index is not None:
            return IndexRanking(lambda padded, _users, _when: content.encode_queries_over(padded, item_table), index,
                                model.max_history)  # fmt: skip
        return FullRanking(_OverItemTable(content, item_table))
    if index is not None:
        assert vectors is not None, "an index serves a model with item vectors"
        return IndexRanking(vectors.encode_queries, index, model.max_history)
    return FullRanking(model, capabilities.domains)


class _OverItemTable:
    """A content-first model scoring every history over a given item table (the catalogue's and the added items)."""

    def __init__(self, model: ContentItemScorer, items: torch.Tensor) -> None:
        self.model, self.items = model, items
        self.max_history = model.max_history

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        return self.model.encode_queries_over(histories, self.items) @ self.items.T


class _RequestedDomains:
    """A model of several domains scoring each row in its requested domain (or its history's, where -1)."""

    def __init__(self, model: DomainScorer, requested: torch.Tensor) -> None:
        self.model, self.requested = model, requested
        self.max_history = model.max_history

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        return self.model.score_in(histories, self.requested)
