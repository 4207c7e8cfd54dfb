"""Metrics against values computed by hand, including ties and the padding column."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.evaluation.metrics import catalog_coverage, ranking_metrics, target_ranks

NEG_INF = float("-inf")


def test_ranks_count_higher_scores_and_ties_pessimistically() -> None:
    scores = torch.tensor(
        [
            [NEG_INF, 0.9, 0.5, 0.5, 0.1],  # target 2 ties with item 3: rank 2 (0.9 and the tie above)
            [NEG_INF, 0.1, 0.2, 0.3, 0.4],  # target 4 is the best: rank 0
            [NEG_INF, 1.0, 1.0, 1.0, 1.0],  # all tied: the target is ranked last (rank 3)
        ]
    )
    assert target_ranks(scores, torch.tensor([2, 4, 1])).tolist() == [2, 0, 3]


def test_padding_column_never_outranks_a_target() -> None:
    scores = torch.tensor([[NEG_INF, -5.0, -6.0]])
    assert target_ranks(scores, torch.tensor([2])).tolist() == [1]


def test_nan_scores_rank_the_target_below_them_and_a_nan_target_last() -> None:
    nan = float("nan")
    scores = torch.tensor(
        [
            [NEG_INF, nan, 0.5, 0.9, 0.1],  # target 2: 0.9 and the NaN above it: rank 2
            [NEG_INF, 0.1, nan, 0.3, 0.4],  # target 2 is NaN (a diverged model): behind every column, rank 4
            [NEG_INF, nan, nan, nan, nan],  # everything NaN: rank 4, never a hit
            [NEG_INF, 0.1, NEG_INF, 0.3, 0.4],  # a target no row may rank (masked -inf) ranks the same: 4
        ]
    )
    ranks = target_ranks(scores, torch.tensor([2, 2, 3, 2]))
    assert ranks.tolist() == [2, 4, 4, 4]
    metrics = ranking_metrics(ranks, ks=(1,))
    assert metrics["ndcg@1"] == 0.0 and metrics["mrr"] == pytest.approx((1 / 3 + 3 / 5) / 4)


def test_hand_computed_recall_ndcg_mrr() -> None:
    ranks = torch.tensor([0, 1, 4, 9, 10])
    m = ranking_metrics(ranks, ks=(1, 5, 10))
    assert m["recall@1"] == pytest.approx(1 / 5)
    assert m["recall@5"] == pytest.approx(3 / 5)
    assert m["recall@10"] == pytest.approx(4 / 5)
    assert m["ndcg@1"] == pytest.approx(1 / 5)
    ndcg5 = (1 + 1 / math.log2(3) + 1 / math.log2(6)) / 5
    assert m["ndcg@5"] == pytest.approx(ndcg5)
    assert m["ndcg@10"] == pytest.approx(ndcg5 + 1 / math.log2(11) / 5)
    assert m["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 5 + 1 / 10 + 1 / 11) / 5)


def test_coverage_ignores_padding_and_counts_distinct_items() -> None:
    top = torch.tensor([[1, 2], [2, 0], [2, 1]])
    assert catalog_coverage(top, num_items=4) == pytest.approx(2 / 4)
