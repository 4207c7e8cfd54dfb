"""Full-ranking metrics from the rank of each user's held-out item, and the metrics of the other tasks' predictions.

Ranks are 0-based and pessimistic about ties: an item scored equal to the target counts as ranked
above it, so a model that scores everything the same gets no credit; a NaN score (a diverged model) counts as
above the target too, so a NaN target ranks last, not first. With one relevant item per user
(leave-one-out), Recall@k equals HitRate@k and NDCG@k = 1 / log2(rank + 2) when rank < k.

Dimension letters: B users in a batch, V+1 items (column 0 = padding, never ranked).
"""

from __future__ import annotations

import torch

from recsys.evaluation.uncertainty import per_user_metrics


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """0-based rank of each target among all items.

    Args:
        scores: (B, V+1) float; the padding column 0 must already be -inf.
        targets: (B,) item_idx of the held-out item.

    Returns:
        (B,) int64: number of items scored higher, plus ties other than the target itself.

    Example:
        >>> s = torch.tensor([[float("-inf"), 0.9, 0.5, 0.5, 0.1]])
        >>> target_ranks(s, torch.tensor([2])).tolist()  # 0.9 above, one tie counted above
        [2]
    """
    target_scores = scores.gather(1, targets[:, None]).squeeze(1)  # (B,)
    return scored_at_or_above(scores, target_scores) - 1  # minus the target itself


def scored_at_or_above(scores: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
    """(B,) how many columns of `scores` (B, n) score at least each row's target score (B,), a NaN on either side
    counted as at least: the tie rule of `target_ranks`, which sums it over the whole catalogue, as ranking in item
    blocks sums it over the blocks.

    Example:
        >>> scored_at_or_above(torch.tensor([[0.9, 0.5, 0.5, 0.1]]), torch.tensor([0.5])).tolist()
        [3]
        >>> scored_at_or_above(torch.tensor([[0.9, 0.5]]), torch.tensor([float("nan")])).tolist()
        [2]
    """
    # The complement of "scored below", which is false for every NaN comparison. One comparison pass over (B, n): a
    # 1-byte mask, summed as int32 because a CUDA sum first converts the whole mask to the sum's type (int64 by
    # default: 8 bytes a score)
    below = (scores < target_scores[:, None]).sum(dim=1, dtype=torch.int32).long()
    return scores.shape[1] - below


def ranking_metrics(ranks: torch.Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    """Recall@k, NDCG@k for every k, and MRR, averaged over users (of `per_user_metrics`, the formulas' one owner).

    Example:
        >>> m = ranking_metrics(torch.tensor([0, 3, 20]), ks=(5,))
        >>> round(m["recall@5"], 4), round(m["ndcg@5"], 4), round(m["mrr"], 4)
        (0.6667, 0.4769, 0.4325)
    """
    names, values = per_user_metrics(ranks, ks)  # (U, M)
    return dict(zip(names, values.mean(dim=0).tolist(), strict=True))


def catalog_coverage(top_items: torch.Tensor, num_items: int) -> float:
    """Fraction of the V catalog items that appear in at least one top-k list.

    Args:
        top_items: (B, k) item_idx of every user's top-k list.
        num_items: V, the catalog size (item_idx 1..V).
    """
    seen = torch.zeros(num_items + 1, dtype=torch.bool)
    seen[top_items.reshape(-1)] = True
    seen[0] = False
    return seen.sum().item() / num_items


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: the probability that a positive scores above a negative (ties count half).

    Args:
        scores: (N,) predictions.
        labels: (N,) 0/1; both classes must occur (else NaN).

    Example:
        >>> auc(torch.tensor([0.1, 0.4, 0.4, 0.9]), torch.tensor([0, 1, 0, 1]))
        0.875
    """
    positives = labels.bool()
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if not n_pos or not n_neg:
        return float("nan")
    _, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts  # 0-based rank of each distinct value's first occurrence
    average_rank = (first + (counts + 1) / 2.0)[inverse]  # 1-based ranks, ties averaged (Mann-Whitney U)
    return float((average_rank[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def rmse(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Root mean squared error.

    Example:
        >>> rmse(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]))
        1.0
    """
    return float(((predictions.double() - labels.double()) ** 2).mean().sqrt())
