"""The search evaluation (docs/search.md): every test user's target ranked over the full catalogue from a text query
made from its title (`recsys.evaluation.queries`, three difficulty levels), with and without the user's history,
beside the history-only recommendation baseline.

Settings, for each level (the users whose query is not empty, with their test query):
    history+query   the user's history and the query (systems that read both: a model that reads queries)
    no-history      the query alone, the history dropped: search (every system that reads a query)
and, level-independent, over every test user:
    history-only    the history alone: recommendation (every system that reads a history)

Metrics are the protocol's (`recsys.evaluation.metrics`): Recall@k and NDCG@k for the eval config's ks (and MRR),
full ranking, the padding never ranked, the history's items masked only with `exclude_seen` and a history given.

Dimension letters: B users in a batch, L history length, V+1 items (0 = padding), U test users.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit
from recsys.evaluation.metrics import ranking_metrics, target_ranks
from recsys.evaluation.protocol import EvalConfig, history_batches
from recsys.evaluation.queries import LEVELS, Level, QueryMaker
from recsys.inference import QueryScorer, Scorer, mask_unrankable
from recsys.retrieval.text import QueryEmbedder

logger = logging.getLogger(__name__)

Signal = Literal["history", "query"]
Setting = Literal["history+query", "no-history"]
HISTORY_ONLY = "history-only"


class SearchSystem(Protocol):
    """Anything that ranks the catalogue from a history, a text query or both."""

    @property
    def reads(self) -> frozenset[Signal]:
        """What it reads: "history", "query" or both."""
        ...

    @property
    def max_history(self) -> int:
        """The most recent history items it reads (0: none)."""
        ...

    def score(self, histories: torch.Tensor | None, queries: Sequence[str] | None) -> torch.Tensor:
        """(B, L) left-padded histories or None, (B,) query texts or None -> (B, V+1) scores, higher is better."""
        ...


class TextRetriever(Protocol):
    def score(self, queries: Sequence[str]) -> torch.Tensor: ...


@dataclass(frozen=True)
class TextSearch:
    """A text retriever (`BM25Retriever`, `DenseTextRetriever`): the query alone."""

    retriever: TextRetriever
    reads: frozenset[Signal] = frozenset({"query"})
    max_history: int = 0

    def score(self, histories: torch.Tensor | None, queries: Sequence[str] | None) -> torch.Tensor:
        if queries is None:
            raise ValueError(f"{type(self.retriever).__name__} ranks from a query alone. Fix: pass the queries")
        return self.retriever.score(queries)


@dataclass(frozen=True)
class HistoryOnly:
    """A sequential model (any `Scorer`, e.g. SASRec): the history alone, as `recsys.evaluation.evaluate` scores it
    (without user ids or times: a model that needs times is not one to adapt here)."""

    model: Scorer
    reads: frozenset[Signal] = frozenset({"history"})

    @property
    def max_history(self) -> int:
        return self.model.max_history

    def score(self, histories: torch.Tensor | None, queries: Sequence[str] | None) -> torch.Tensor:
        if histories is None:
            raise ValueError(f"{type(self.model).__name__} ranks from a history alone. Fix: pass the histories")
        return self.model.score(histories)


@dataclass(frozen=True)
class QuerySearch:
    """A model that reads text queries (`recsys.inference.QueryScorer`): a history, a query or both (no history: an
    empty one). Queries are embedded by `embed`, which must hold the `ContentConfig` the model's content was embedded
    with."""

    model: QueryScorer
    embed: QueryEmbedder
    reads: frozenset[Signal] = frozenset({"history", "query"})

    @property
    def max_history(self) -> int:
        return self.model.max_history

    def score(self, histories: torch.Tensor | None, queries: Sequence[str] | None) -> torch.Tensor:
        if queries is None:
            if histories is None:
                raise ValueError("nothing to rank from. Fix: pass a history, a query or both")
            return self.model.score(histories)
        if histories is None:
            histories = torch.zeros(len(queries), 0, dtype=torch.long)  # (B, 0): no history
        return self.model.score_with_queries(histories, self.embed(queries), queries)


@dataclass(frozen=True)
class SearchEvaluation:
    """The numbers of `evaluate_search`, ready for JSON (`to_dict`).

    Attributes:
        ks: the cut-offs of Recall@k / NDCG@k.
        users: U, the test users (the history-only baseline ranks all of them).
        queried: users with a (non-empty) query at each level: those its settings rank.
        history_only: {system: metrics} over every test user.
        levels: {level: {setting: {system: metrics}}}.
        ranks: {"<level>/<setting>/<system>": (rows (n,) the test users ranked, their targets' 0-based ranks (n,))}:
            what two evaluations are compared with, user by user (not in `to_dict`).
    """

    ks: tuple[int, ...]
    users: int
    queried: dict[str, int]
    history_only: dict[str, dict[str, float]] = field(default_factory=dict)
    levels: dict[str, dict[str, dict[str, dict[str, float]]]] = field(default_factory=dict)
    ranks: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in ("ks", "users", "queried", "history_only", "levels")}


def level_queries(
    maker: QueryMaker, split: EvalSplit, training: Mapping[int, Sequence[str]] | None = None
) -> dict[Level, list[str]]:
    """{level: (U,) the test query of every user of `split`, made from its target's title}, none equal to one of the
    target's `training` queries ("" where there is no usable query)."""
    targets = split.targets.tolist()
    return {level: maker.test_queries(targets, level, training) for level in LEVELS}


@torch.no_grad()
def evaluate_search(
    systems: Mapping[str, SearchSystem],
    split: EvalSplit,
    queries: Mapping[Level, Sequence[str]],
    config: EvalConfig | None = None,
) -> SearchEvaluation:
    """Rank every test user's target in each setting every system can take (module docstring).

    Args:
        systems: {name: system}; each in the settings it reads (models in eval mode).
        split: the test split (histories and targets of U users).
        queries: {level: (U,) one query per user of `split`, "" for none} (`level_queries`).
        config: ks, `exclude_seen` and the user batch size.
    """
    config = config or EvalConfig()
    users = len(split.targets)
    everyone = torch.arange(users)
    queried = {level: _with_query(texts, users) for level, texts in queries.items()}
    for level, rows in queried.items():
        logger.info("search level %s: %d of %d test users have a query", level, len(rows), users)
    result = SearchEvaluation(tuple(config.ks), users, {level: len(rows) for level, rows in queried.items()})
    for name, system in systems.items():
        if "history" in system.reads:
            result.history_only[name] = _metrics(name, HISTORY_ONLY, system, split, everyone, None, True, config,
                                                 result.ranks)  # fmt: skip
    for level, rows in queried.items():
        texts = queries[level]
        settings: dict[str, dict[str, dict[str, float]]] = {"history+query": {}, "no-history": {}}
        for name, system in systems.items():
            if "query" not in system.reads:
                continue
            if "history" in system.reads:
                settings["history+query"][name] = _metrics(name, level, system, split, rows, texts, True, config,
                                                           result.ranks)  # fmt: skip
            settings["no-history"][name] = _metrics(name, level, system, split, rows, texts, False, config,
                                                    result.ranks)  # fmt: skip
        result.levels[level] = settings
    return result


def _with_query(texts: Sequence[str], users: int) -> torch.Tensor:
    """(n,) ascending rows of the users whose query is not empty."""
    if len(texts) != users:
        raise ValueError(f"{len(texts)} queries for {users} test users. Fix: one query per user of the split")
    return torch.tensor([row for row, text in enumerate(texts) if text.strip()], dtype=torch.int64)


def _metrics(
    name: str,
    level: str,
    system: SearchSystem,
    split: EvalSplit,
    rows: torch.Tensor,
    queries: Sequence[str] | None,
    with_history: bool,
    config: EvalConfig,
    kept: dict[str, tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, float]:
    """The metrics of `system` on the users `rows` in one setting; their ranks go into `kept`."""
    start = time.perf_counter()
    ranks = torch.empty(len(rows), dtype=torch.int64)
    for batch, histories, width in _batches(split, rows, system.max_history if with_history else 0, config):
        padded = None if histories is None else histories.to_padded(width)
        texts = None if queries is None else [queries[row] for row in batch.tolist()]
        scores = system.score(padded, texts).float()  # (B, V+1)
        seen = histories if config.exclude_seen else None
        scores = mask_unrankable(scores, seen, candidates=split.candidates)
        ranks[torch.searchsorted(rows, batch)] = target_ranks(scores, split.targets[batch].to(scores.device)).cpu()
    metrics = ranking_metrics(ranks, config.ks)
    setting = HISTORY_ONLY if queries is None else ("history+query" if with_history else "no-history")
    kept[f"{setting}/{name}" if queries is None else f"{level}/{setting}/{name}"] = (rows, ranks)
    logger.info(
        "%s, %s: %d users in %.1f s, N@10 %.4f",
        name,
        setting if queries is None else f"{level}, {setting}",
        len(rows),
        time.perf_counter() - start,
        metrics.get("ndcg@10", float("nan")),
    )
    return metrics


def _batches(
    split: EvalSplit, rows: torch.Tensor, max_history: int, config: EvalConfig
) -> Iterator[tuple[torch.Tensor, Jagged | None, int]]:
    """(rows, their histories or None, the padded width): by history length with a history, else in row order."""
    if max_history:
        yield from history_batches(split, max_history, config.batch_size, rows)
        return
    for batch in rows.split(config.batch_size):
        yield batch, None, 0
