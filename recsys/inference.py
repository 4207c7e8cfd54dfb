"""What every model is to evaluation, recommendation and serving: the `Scorer` protocol and its capabilities
(`VectorScorer`, `QueryScorer`, `MultiTaskScorer`, `SourcedScorer`, `DomainScorer`), masking and top-k.

Top-k lists order equal scores by item id, lowest first, wherever they are made (`top_k` on whole rows, `merge_topk`
over item blocks; the order itself: `recsys.ordering`), so which of several tied items makes a list does not depend on
the device or on blocking.

Dimension letters: B users, L history length, V+1 items (0 = padding), n items of a block, k list length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from recsys.data.jagged import Jagged
from recsys.data.schema import PADDING_IDX
from recsys.data.tasks import Task
from recsys.data.times import HistoryTimes
from recsys.models.sources import SourceCall
from recsys.ordering import best_first


class Scorer(Protocol):
    """Anything that scores every item for a batch of histories (every model implements this)."""

    @property
    def max_history(self) -> int:
        """The most recent history items `score` reads: what evaluation, recommendation and serving feed it."""
        ...

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded item_idx [+ (B,) user_idx, 0 = unknown] [+ the history's and the request's times]
        -> (B, V+1) scores; higher is better.

        Models that do not personalise beyond the history ignore `users`; models without a sense of time
        ignore `times` (time-aware ones raise without them).
        """
        ...


@runtime_checkable
class VectorScorer(Scorer, Protocol):
    """A scorer whose scores rank like a dot product of a user vector and the item vectors, so that an index of its
    item vectors (FAISS) can serve it, and evaluation can rank a large catalogue a block of item vectors at a time
    (`recsys.evaluation.EvalConfig.item_block`)."""

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D) user vectors."""
        ...

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) item vectors; row 0 is the padding."""
        ...


@runtime_checkable
class ContentItemScorer(VectorScorer, Protocol):
    """A vector scorer whose item vectors can come from the items' content alone: an item it never trained on (added
    at run time) gets a vector from its text's embedding, and is read in histories and ranked like the catalogue's."""

    @property
    def content_encoder(self) -> str | None:
        """The content encoder (`recsys.semantic_ids.content.ContentConfig.model`) its items' texts are embedded with;
        None when this model's items do not come from content (it cannot take new ones)."""
        ...

    def vectors_of_content(self, content: torch.Tensor) -> torch.Tensor:
        """(N, C) content embeddings of items it never trained on -> (N, D) their item vectors."""
        ...

    def encode_queries_over(self, histories: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded histories whose ids index `items`, (V+1+N, D) item vectors (the catalogue's and N new
        ones) -> (B, D) user vectors, scored against `items` by a dot product."""
        ...


@runtime_checkable
class QueryScorer(Scorer, Protocol):
    """A scorer that also reads a text query beside the history, or alone (search): the query's embedding by the
    content encoder that embedded the items, and its text."""

    @property
    def query_encoder(self) -> str:
        """The content encoder (`recsys.semantic_ids.content.ContentConfig.model`) its queries are embedded with."""
        ...

    def score_with_queries(
        self, histories: torch.Tensor, queries: torch.Tensor, texts: Sequence[str] | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories (an all-padding row, or L = 0: no history) + (B, C) query embeddings and
        their (B,) texts -> (B, V+1) scores over all items."""
        ...


@runtime_checkable
class MultiTaskScorer(Scorer, Protocol):
    """A scorer that also predicts the labels of the tasks beside ranking (`recsys.data.tasks`) for given items."""

    @property
    def tasks(self) -> tuple[Task, ...]:
        """The tasks it predicts, in the order of `task_predictions`' rows."""
        ...

    def task_predictions(
        self, histories: torch.Tensor, items: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories, (B,) items -> (T, B): probabilities (binary tasks) or values (regression)."""
        ...


@runtime_checkable
class SourcedScorer(Scorer, Protocol):
    """A scorer whose candidates come from several sources (the ranker with `sources`): serving reports each
    one's time and failures."""

    @property
    def last_source_calls(self) -> tuple[SourceCall, ...]:
        """Each source's part of the last `score` call (calls are made one at a time on the model thread)."""
        ...


@runtime_checkable
class DomainScorer(Scorer, Protocol):
    """A scorer of several domains: a request may name the domain to recommend in (its items only)."""

    @property
    def domains(self) -> tuple[str, ...]:
        """The domain names, in index order."""
        ...

    @property
    def item_domain(self) -> torch.Tensor:
        """(V+1,) every item's domain index, -1 for the padding."""
        ...

    def score_in(self, histories: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """(B, L) histories scored in `domains` (B,) (-1: the history's own) -> (B, V+1), other domains' items -inf."""
        ...


def mask_unrankable(
    scores: torch.Tensor, seen: Jagged | None, first_item: int = 0, candidates: torch.Tensor | None = None
) -> torch.Tensor:
    """In place: padding is never a candidate; with `seen`, neither are the items of each history row; with
    `candidates`, neither are the items outside it.

    Args:
        scores: (B, n) float, the scores of items `first_item` .. `first_item` + n - 1 (all V+1 items by default).
        seen: (B,) rows of item_idx to exclude, or None.
        first_item: the item_idx of column 0: a block of the catalogue starts elsewhere.
        candidates: (V+1,) bool, the items that may be ranked; None = every item.
    """
    if first_item == PADDING_IDX:
        scores[:, 0] = float("-inf")
    if seen is not None:
        rows = torch.repeat_interleave(torch.arange(len(seen)), seen.lengths())
        columns = seen.values - first_item
        inside = (columns >= 0) & (columns < scores.shape[1])
        scores[rows[inside].to(scores.device), columns[inside].to(scores.device)] = float("-inf")
    if candidates is not None:
        outside = ~candidates[first_item : first_item + scores.shape[1]].to(scores.device)
        scores.masked_fill_(outside[None, :], float("-inf"))
    return scores


def is_rankable(items: torch.Tensor, seen: Jagged | None, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) one item_idx per row -> (B,) bool: False where `mask_unrankable` masks that row's item.

    Example:
        >>> is_rankable(torch.tensor([2, 2, 0]), Jagged.from_lists([[1], [2, 3], []])).tolist()
        [True, False, False]
    """
    rankable = items != PADDING_IDX
    if seen is not None:
        rows = torch.repeat_interleave(torch.arange(len(seen)), seen.lengths())
        hit_rows = rows[seen.values == items.cpu()[rows]]
        rankable &= ~torch.zeros_like(rankable).index_fill_(0, hit_rows.to(items.device), True)
    if candidates is not None:
        rankable &= candidates.to(items.device)[items]
    return rankable


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best columns of every row, best first; among equal scores the lower column first.

    `torch.topk` leaves ties unspecified (CPU and CUDA differ), which decides which of several tied items makes a
    list; rows where it had to choose among items tied at the k-th score are chosen again here, lowest columns first.

    Args:
        scores: (B, n) float.
        k: list length (at most n is returned).

    Returns:
        (values (B, min(k, n)), columns (B, min(k, n))).

    Example:
        >>> top_k(torch.tensor([[0.5, 0.9, 0.5, 0.5]]), 2)[1].tolist()
        [[1, 0]]
    """
    k = min(k, scores.shape[1])
    values, columns = scores.topk(k, dim=1)
    kth = values[:, -1:]  # (B, 1)
    # int32: a CUDA sum first converts the whole (B, n) mask to the sum's type, 8 bytes a score with the default int64
    tied_with_kth = (scores == kth).sum(dim=1, dtype=torch.int32)
    chose_among_ties = tied_with_kth > (values == kth).sum(dim=1)
    if bool(chose_among_ties.any()):
        rows = chose_among_ties.nonzero().squeeze(1)
        tied_rows, row_kth = scores[rows], kth[rows]
        above, tied = tied_rows > row_kth, tied_rows == row_kth
        wanted = k - above.sum(dim=1, keepdim=True, dtype=torch.int32)  # all scores above the k-th are in: add ties
        chosen = above | (tied & (tied.cumsum(dim=1, dtype=torch.int32) <= wanted))
        columns[rows] = chosen.nonzero()[:, 1].view(-1, k)  # k per row, in column order
        values[rows] = tied_rows.gather(1, columns[rows])
    return best_first(values, columns, k)


def merge_topk(
    best_scores: torch.Tensor, best_ids: torch.Tensor, block_scores: torch.Tensor, block_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A running top-k over blocks of items: the k best of the lists so far and of one more block.

    Merging every block of a row in turn gives what `top_k` gives on the whole row (ties: lower item id first).

    Args:
        best_scores, best_ids: (B, k') the lists so far, best first (k' = 0 before the first block).
        block_scores: (B, n) the scores of the block's items.
        block_ids: (n,) the item ids of the block's columns.
        k: list length.

    Returns:
        (scores (B, min(k, k' + n)), item ids (B, min(k, k' + n))), best first.

    Example:
        >>> none = torch.empty(1, 0), torch.empty(1, 0, dtype=torch.int64)
        >>> scores, ids = merge_topk(*none, torch.tensor([[0.2, 0.7]]), torch.tensor([1, 2]), k=2)
        >>> merge_topk(scores, ids, torch.tensor([[0.7, 0.1]]), torch.tensor([3, 4]), k=2)[1].tolist()
        [[2, 3]]
    """
    values, columns = top_k(block_scores, k)
    return best_first(torch.cat([best_scores, values], dim=1), torch.cat([best_ids, block_ids[columns]], dim=1), k)


@torch.no_grad()
def recommend(
    scorer: Scorer,
    histories: Jagged,
    k: int,
    exclude_seen: bool | torch.Tensor = True,
    users: torch.Tensor | None = None,
    timestamps: Jagged | None = None,
    request_times: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k items for every history: what recommendation and serving rank with, as evaluation does (each history
    padded to the longest of the batch, at most the `scorer.max_history` items it reads; `rank_scores`).

    Args:
        scorer: model with `score((B, L), users, times) -> (B, V+1)`; it reads the most recent `scorer.max_history`
            items of each history.
        histories: (B,) rows of item_idx, oldest first.
        k: list length (at most V).
        exclude_seen: drop items already in the history (what a product page wants); a (B,) bool tensor
            decides it row by row.
        users: (B,) user_idx of the rows (0 = unknown user), for models with a user token; None = unknown.
        timestamps: (B,) rows aligned with `histories`, unix seconds of every item, for time-aware models.
        request_times: (B,) unix seconds of the requests (with `timestamps`).

    Returns:
        (scores (B, k), item_idx (B, k)), best first (equal scores: lower item_idx first).
    """
    width = padded_width(histories, scorer.max_history)
    times = None
    if timestamps is not None:
        if request_times is None:
            raise ValueError("timestamps need request_times: the moment each recommendation is for")
        times = HistoryTimes(timestamps.to_padded(width), request_times)
    scores = scorer.score(histories.to_padded(width), users, times)
    return rank_scores(scores, histories, k, exclude_seen)


def padded_width(histories: Jagged, max_history: int) -> int:
    """The width a batch of histories is padded to: its longest history, at most the `max_history` items a model
    reads (at least 1).

    Example:
        >>> padded_width(Jagged.from_lists([[1, 2, 3], [4]]), max_history=2), padded_width(Jagged.from_lists([[]]), 5)
        (2, 1)
    """
    longest = int(histories.lengths().max()) if len(histories) else 0
    return max(1, min(longest, max_history))


def rank_scores(
    scores: torch.Tensor, histories: Jagged, k: int, exclude_seen: bool | torch.Tensor = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k of each row of `scores` (B, n): the padding masked and, where `exclude_seen` says (one flag, or one
    per row), the row's history; equal scores in item id order (`top_k`). Whatever made the scores (a history, a text
    query, both), recommendations are ranked here.

    Returns:
        (scores (B, min(k, n - 1)), item_idx (B, min(k, n - 1))) on the CPU, best first.
    """
    masked = mask_unrankable(scores.float(), _rows_to_exclude(histories, exclude_seen))
    values, items = top_k(masked, min(k, masked.shape[1] - 1))
    return values.cpu(), items.cpu()


def _rows_to_exclude(histories: Jagged, exclude_seen: bool | torch.Tensor) -> Jagged | None:
    """The history items to mask: all of them, none, or those of the rows whose flag is set."""
    if isinstance(exclude_seen, bool):
        return histories if exclude_seen else None
    lengths = histories.lengths() * exclude_seen.to(torch.int64)
    keep = torch.repeat_interleave(exclude_seen, histories.lengths())
    return Jagged.from_lengths(histories.values[keep], lengths)
