"""Masking and top-k shared by evaluation, recommendation and serving: blocks of the catalogue give what whole rows
give, ties go to the lower item id."""

from __future__ import annotations

import pytest
import torch

from recsys.data.jagged import Jagged
from recsys.inference import is_rankable, mask_unrankable, merge_topk, top_k

INF = float("inf")


def tied_scores(rows: int, items: int, seed: int) -> torch.Tensor:
    """(rows, items) scores from a handful of values, so most scores tie, with some -inf (masked) among them."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (rows, items), generator=generator).float()
    return scores.masked_fill(torch.rand(rows, items, generator=generator) < 0.3, -INF)


def best_first_by_sort(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference order: a stable sort, highest score first, equal scores in column order."""
    values, columns = scores.sort(dim=1, descending=True, stable=True)
    return values[:, :k], columns[:, :k]


@pytest.mark.parametrize("k", [1, 5, 16, 40])
def test_top_k_keeps_torch_topk_values_and_breaks_ties_by_lower_column(k: int) -> None:
    scores = tied_scores(rows=32, items=40, seed=k)
    values, columns = top_k(scores, k)
    assert torch.equal(values, scores.topk(k, dim=1).values)
    expected_values, expected_columns = best_first_by_sort(scores, k)
    assert torch.equal(values, expected_values) and torch.equal(columns, expected_columns)


def test_top_k_picks_the_lowest_columns_among_ties_at_the_kth_place() -> None:
    scores = torch.tensor([[1.0, 3.0, 1.0, 1.0, 2.0, 1.0], [-INF, -INF, 5.0, -INF, -INF, -INF]])
    values, columns = top_k(scores, 3)
    assert columns.tolist() == [[1, 4, 0], [2, 0, 1]]
    assert values[1].tolist() == [5.0, -INF, -INF]
    assert top_k(scores, 10)[1].shape == (2, 6)  # at most the row's length


@pytest.mark.parametrize("block", [1, 3, 7, 40])
@pytest.mark.parametrize("k", [1, 10, 25])
def test_merging_blocks_gives_the_top_k_of_the_whole_row(block: int, k: int) -> None:
    scores = tied_scores(rows=16, items=40, seed=block * 100 + k)
    best_scores, best_ids = torch.empty(16, 0), torch.empty(16, 0, dtype=torch.int64)
    for first in range(0, 40, block):
        block_ids = torch.arange(first, min(first + block, 40))
        best_scores, best_ids = merge_topk(best_scores, best_ids, scores[:, block_ids], block_ids, k)
    assert torch.equal(best_scores, scores.topk(k, dim=1).values)
    expected_values, expected_ids = best_first_by_sort(scores, k)
    assert torch.equal(best_scores, expected_values) and torch.equal(best_ids, expected_ids)


@pytest.mark.parametrize("first", [0, 1, 3, 5])
def test_masking_a_block_masks_the_same_items_as_masking_the_whole_row(first: int) -> None:
    seen = Jagged.from_lists([[1, 4, 6], [], [2, 3]])
    candidates = torch.tensor([True, True, False, True, True, True, False, True])
    whole = mask_unrankable(torch.rand(3, 8), seen, candidates=candidates)
    block = mask_unrankable(torch.rand(3, 3), seen, first, candidates)  # items first .. first + 2
    assert torch.equal(block == -INF, whole[:, first : first + 3] == -INF)


def test_is_rankable_agrees_with_the_mask() -> None:
    seen = Jagged.from_lists([[1, 4], [2], [], [3]])
    candidates = torch.tensor([True, True, True, False, True])
    items = torch.tensor([4, 1, 0, 3])
    masked = mask_unrankable(torch.zeros(4, 5), seen, candidates=candidates)
    assert is_rankable(items, seen, candidates).tolist() == (masked[torch.arange(4), items] == 0).tolist()
    assert is_rankable(items, seen, candidates).tolist() == [False, True, False, False]
    assert is_rankable(items, None).tolist() == [True, True, False, True]
