"""Metrics on subsets of users (slices), computed from the per-user ranks of one evaluation."""

from __future__ import annotations

import torch

from recsys.evaluation.metrics import ranking_metrics


def slice_metrics(ranks: torch.Tensor, members: torch.Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    """Ranking metrics over the users where `members` (bool, aligned with `ranks`) is True.

    Returns {"users": n, ...metrics}; metrics are NaN-free: an empty slice gives {"users": 0}.

    Example:
        >>> slice_metrics(torch.tensor([0, 7, 1]), torch.tensor([True, False, True]), ks=(1,))["recall@1"]
        0.5
    """
    count = int(members.sum())
    if count == 0:
        return {"users": 0}
    return {"users": count, **ranking_metrics(ranks[members], ks)}
