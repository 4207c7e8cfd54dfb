"""The evaluation protocol (docs/training.md): leave-one-out, ranking over all items, batched.

Dimension letters: B users in a batch, L history length, V+1 items (0 = padding).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from pydantic import PositiveInt

from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit
from recsys.evaluation.metrics import catalog_coverage, ranking_metrics, target_ranks
from recsys.inference import Scorer, mask_unrankable

DEFAULT_KS = (5, 10, 50)


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate. Defaults are the platform's protocol (nothing excluded)."""

    ks: tuple[PositiveInt, ...] = DEFAULT_KS
    # Mask the user's history items before ranking. Off by default: the published protocol ranks
    # every item, and a target that repeats a history item then counts as a miss.
    exclude_seen: bool = False
    batch_size: PositiveInt = 1024


@dataclass(frozen=True)
class EvalResult:
    """Metrics averaged over users plus each user's target rank (for slices)."""

    metrics: dict[str, float]
    ranks: torch.Tensor  # (U,) 0-based rank of each user's target, in the split's user order
    config: EvalConfig = field(default_factory=EvalConfig)


@torch.no_grad()
def evaluate(scorer: Scorer, split: EvalSplit, num_items: int, config: EvalConfig | None = None) -> EvalResult:
    """Rank every user's target among all V items and average the metrics.

    Users are batched by history length so each batch is padded only to its own longest history (at most the
    `scorer.max_history` items the model reads).

    Args:
        scorer: model with `score(histories, users, times) -> (B, V+1)`.
        split: histories and targets (e.g. `SequenceData.eval_split("test")`).
        num_items: V.
        config: ks, exclusion and batching; defaults to the platform's protocol.
    """
    config = config or EvalConfig()
    num_users = len(split.targets)
    ranks = torch.empty(num_users, dtype=torch.int64)
    tops = torch.empty(num_users, max(config.ks), dtype=torch.int64)
    for rows, histories, width in history_batches(split, scorer.max_history, config.batch_size):
        times = split.times(rows, width)  # None without timestamps
        scores = scorer.score(histories.to_padded(width), split.user_idx[rows], times).float()  # (B, V+1)
        scores = mask_unrankable(scores, histories if config.exclude_seen else None)
        if split.candidates is not None:  # e.g. the users' domain: other items are not ranked
            scores[:, ~split.candidates.to(scores.device)] = float("-inf")
        ranks[rows] = target_ranks(scores, split.targets[rows].to(scores.device)).cpu()
        tops[rows] = scores.topk(max(config.ks), dim=1).indices.cpu()
    metrics = ranking_metrics(ranks, config.ks)
    for k in config.ks:
        metrics[f"coverage@{k}"] = catalog_coverage(tops[:, :k], num_items)
    return EvalResult(metrics=metrics, ranks=ranks, config=config)


def history_batches(split: EvalSplit, max_history: int, batch_size: int) -> Iterator[tuple[torch.Tensor, Jagged, int]]:
    """`split`'s users in batches of similar history length: (rows, their histories, the padded width), so each batch
    is padded only to its own longest history (at most the `max_history` items the model reads)."""
    lengths = split.histories.lengths().clamp(max=max_history)
    for rows in torch.split(torch.argsort(lengths, stable=True), batch_size):
        yield rows, split.histories.select(rows), max(1, int(lengths[rows].max()))
