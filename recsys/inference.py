"""What every model is to evaluation, recommendation and serving: the `Scorer` protocol and its capabilities
(`VectorScorer`, `MultiTaskScorer`, `DomainScorer`), masking and top-k.

Dimension letters: B users, L history length, V+1 items (0 = padding).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from recsys.data.jagged import Jagged
from recsys.data.tasks import Task
from recsys.data.times import HistoryTimes


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
    item vectors (FAISS) can serve it."""

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D) user vectors."""
        ...

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) item vectors; row 0 is the padding."""
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


def mask_unrankable(scores: torch.Tensor, seen: Jagged | None) -> torch.Tensor:
    """In place: padding is never a candidate; with `seen`, neither are the items of each history row.

    Args:
        scores: (B, V+1) float.
        seen: (B,) rows of item_idx to exclude, or None.
    """
    scores[:, 0] = float("-inf")
    if seen is not None:
        rows = torch.repeat_interleave(torch.arange(len(seen)), seen.lengths()).to(scores.device)
        scores[rows, seen.values.to(scores.device)] = float("-inf")
    return scores


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
    """Top-k items for every history.

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
        (scores (B, k), item_idx (B, k)), best first.
    """
    times = None
    if timestamps is not None:
        if request_times is None:
            raise ValueError("timestamps need request_times: the moment each recommendation is for")
        times = HistoryTimes(timestamps.to_padded(scorer.max_history), request_times)
    scores = scorer.score(histories.to_padded(scorer.max_history), users, times).float()
    scores = mask_unrankable(scores, _rows_to_exclude(histories, exclude_seen))
    k = min(k, scores.shape[1] - 1)
    top = scores.topk(k, dim=1)
    return top.values.cpu(), top.indices.cpu()


def _rows_to_exclude(histories: Jagged, exclude_seen: bool | torch.Tensor) -> Jagged | None:
    """The history items to mask: all of them, none, or those of the rows whose flag is set."""
    if isinstance(exclude_seen, bool):
        return histories if exclude_seen else None
    lengths = histories.lengths() * exclude_seen.to(torch.int64)
    keep = torch.repeat_interleave(exclude_seen, histories.lengths())
    return Jagged.from_lengths(histories.values[keep], lengths)
