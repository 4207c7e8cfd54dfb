"""Full ranking in item blocks: what one (B, V+1) score matrix gives, for models with item vectors, with memory
bounded by the block instead of the catalogue (docs/training.md, `EvalConfig.item_block`).

A block's scores are the user vectors times the block's item vectors, masked as the whole matrix would be; each
target's rank is summed over the blocks with the tie rule of `target_ranks` (items scored equal to the target count
above it), and the top-k lists are merged block by block (`merge_topk`: equal scores, lower item id first).

Dimension letters: B users in a batch, D vector size, V+1 items (0 = padding), n items of a block, k list length.
"""

from __future__ import annotations

import torch

from recsys.data.jagged import Jagged
from recsys.evaluation.metrics import scored_at_or_above
from recsys.inference import is_rankable, mask_unrankable, merge_topk


def item_blocks(num_items: int, item_block: int) -> list[tuple[int, int]]:
    """[first, stop) item_idx ranges of `item_block` items covering 1..V; the padding column 0 rides with the first.

    Example:
        >>> item_blocks(5, 2)
        [(0, 3), (3, 5), (5, 6)]
    """
    return [
        (0 if start == 1 else start, min(start + item_block, num_items + 1))
        for start in range(1, num_items + 1, item_block)
    ]


def rank_in_item_blocks(
    queries: torch.Tensor,
    items: torch.Tensor,
    targets: torch.Tensor,
    seen: Jagged | None,
    candidates: torch.Tensor | None,
    k: int,
    item_block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's target rank and top-k items, scoring `item_block` items at a time.

    Args:
        queries: (B, D) user vectors; the scores are `queries @ items.T`.
        items: (V+1, D) item vectors, row 0 the padding.
        targets: (B,) item_idx of the held-out items.
        seen: (B,) rows of item_idx no row may rank (its history), or None.
        candidates: (V+1,) bool, the items that may be ranked; None = every item.
        k: top-k list length.
        item_block: items scored at once.

    Returns:
        (ranks (B,) as `target_ranks` counts them, top-k item_idx (B, k) as `top_k` picks them), on the queries'
        device.
    """
    device = queries.device
    targets = targets.to(device)
    target_vectors = items[targets]  # (B, D)
    target_rankable = is_rankable(targets, seen, candidates)
    at_or_above = torch.zeros(len(targets), dtype=torch.int64, device=device)
    best_scores = torch.empty(len(targets), 0, device=device)
    best_ids = torch.empty(len(targets), 0, dtype=torch.int64, device=device)
    for first, stop in item_blocks(len(items) - 1, item_block):
        # The targets' vectors join every block's product, so each block compares its items with target scores from
        # the same kernel call: an item whose vector equals the target's ties with it exactly, as in one (B, V+1)
        # product, and the target, in its own block, counts itself exactly once.
        product = (queries @ torch.cat([items[first:stop], target_vectors]).T).float()  # (B, n + B)
        scores = mask_unrankable(product[:, : stop - first], seen, first, candidates)
        target_scores = product[:, stop - first :].diagonal().masked_fill(~target_rankable, float("-inf"))
        at_or_above += scored_at_or_above(scores, target_scores)
        block_ids = torch.arange(first, stop, device=device)
        best_scores, best_ids = merge_topk(best_scores, best_ids, scores, block_ids, k)
    return at_or_above - 1, best_ids  # minus the target itself
