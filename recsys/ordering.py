"""The one order of ranked lists: score, highest first; equal scores by item id, lowest first.

`recsys.inference`'s top-k lists and the ranker's candidate union (`recsys.models.sources`) both sort by it, so which
of several tied items comes first does not depend on the device, on blocking or on the path that made the list.
"""

from __future__ import annotations

import torch


def best_first(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, n) scores and their item ids (distinct per row) -> the first k of each row in that order: (scores, ids).

    Example:
        >>> best_first(torch.tensor([[0.5, 0.9, 0.5]]), torch.tensor([[7, 3, 2]]), 2)[1].tolist()
        [[3, 2]]
    """
    ids, by_id = ids.sort(dim=1)
    scores, by_score = scores.gather(1, by_id).sort(dim=1, descending=True, stable=True)
    return scores[:, :k], ids.gather(1, by_score)[:, :k]
