"""Intervals and the paired test (`recsys.evaluation.uncertainty`): they contain the estimate, cover the true mean as
often as they say, detect a real shift and not noise, repeat with the seed, and run within the issue's budget."""

from __future__ import annotations

import time

import pytest
import torch

from recsys.evaluation.metrics import ranking_metrics
from recsys.evaluation.uncertainty import (
    Uncertainty,
    bootstrap_intervals,
    metric_intervals,
    paired_difference,
    per_user_metrics,
    seed_summary,
)


def _ranks(users: int, seed: int, scale: float = 30.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(users, generator=generator) ** 2 * scale).long()  # many small ranks, a long tail


def test_ranking_metrics_are_the_mean_of_the_per_user_values() -> None:
    ranks = _ranks(500, seed=1)
    names, values = per_user_metrics(ranks, (5, 10))
    assert names == ["recall@5", "ndcg@5", "recall@10", "ndcg@10", "mrr"]
    assert ranking_metrics(ranks, (5, 10)) == pytest.approx(dict(zip(names, values.mean(0).tolist(), strict=True)))


def test_every_interval_contains_its_point_estimate_and_repeats_with_the_seed() -> None:
    ranks = _ranks(2000, seed=2)
    means = ranking_metrics(ranks, (5, 10))
    intervals = metric_intervals(ranks, (5, 10), Uncertainty(resamples=500, seed=7))
    for metric, (low, high) in intervals.items():
        assert low < means[metric] < high, metric
    assert metric_intervals(ranks, (5, 10), Uncertainty(resamples=500, seed=7)) == intervals
    assert metric_intervals(ranks, (5, 10), Uncertainty(resamples=500, seed=8)) != intervals
    assert metric_intervals(ranks, (5, 10), Uncertainty(resamples=0)) == {}  # off


def test_intervals_cover_the_true_mean_about_as_often_as_their_confidence() -> None:
    """200 samples of 300 Bernoulli(0.3) users: about 95 % of their 95 % intervals hold 0.3 (binomial sd ~1.5 %)."""
    generator = torch.Generator().manual_seed(0)
    hits = 0
    for trial in range(200):
        values = (torch.rand(300, 1, generator=generator) < 0.3).double()
        low, high = bootstrap_intervals(values, Uncertainty(resamples=400, seed=trial))[0].tolist()
        hits += low <= 0.3 <= high
    assert 0.89 <= hits / 200 <= 0.99


def test_the_paired_test_finds_a_real_shift_and_not_noise() -> None:
    ranks = _ranks(3000, seed=3)
    names, a = per_user_metrics(ranks, (10,))
    better = per_user_metrics((ranks - 3).clamp(min=0), (10,))[1]  # every target 3 places higher
    shifted = paired_difference(better, a, names, Uncertainty(resamples=1000))
    assert all(d.difference > 0 and d.low > 0 and d.p_value < 0.01 for d in shifted)
    assert all(d.low <= d.difference <= d.high and d.users == 3000 for d in shifted)

    same = paired_difference(a, a, names, Uncertainty(resamples=200))
    assert all(d.difference == d.low == d.high == 0.0 and d.p_value == 1.0 for d in same)
    noise = per_user_metrics(ranks[torch.randperm(3000, generator=torch.Generator().manual_seed(4))], (10,))[1]
    shuffled = paired_difference(noise, a, names, Uncertainty(resamples=1000))  # the same values, users permuted
    assert all(d.p_value > 0.05 and d.low < 0 < d.high for d in shuffled)
    assert paired_difference(noise, a, names, Uncertainty(resamples=1000)) == shuffled  # seeded


def test_a_paired_test_of_different_users_is_refused() -> None:
    names, a = per_user_metrics(_ranks(10, seed=0), (10,))
    with pytest.raises(ValueError, match=r"the same users in both: \(10, 3\) vs \(9, 3\) .*Fix: evaluate both"):
        paired_difference(a, a[:9], names, Uncertainty())


def test_seed_summary_is_the_mean_and_sample_standard_deviation() -> None:
    assert seed_summary([0.04, 0.05, 0.06]) == {"mean": 0.05, "std": 0.01, "seeds": 3}
    assert seed_summary([0.04]) == {"mean": 0.04, "std": 0.0, "seeds": 1}


def test_1000_resamples_of_22k_users_and_6_metrics_take_under_10_seconds() -> None:
    """The issue's budget on 2 cores (Beauty's test split: ~22k users; ks 5, 10, 50 give 7 metrics, 6 here)."""
    values = torch.rand(22_000, 6, dtype=torch.float64)
    start = time.perf_counter()
    intervals = bootstrap_intervals(values, Uncertainty(resamples=1000))
    seconds = time.perf_counter() - start
    assert intervals.shape == (6, 2) and seconds < 10.0, seconds
