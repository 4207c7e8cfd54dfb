"""Micro-batching: concurrent requests share one model call and get exactly what they would get alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from recsys.artifacts.registry import download_champion_bundle
from serving.batcher import MicroBatcher
from serving.metrics import ServingMetrics
from serving.recommender import RecommendationQuery, Recommender


def queries(recommender: Recommender) -> list[RecommendationQuery]:
    """Mixed lengths, k and exclusion, and one empty history (popularity)."""
    users = recommender.histories.user_ids[:8]
    rows = [recommender.histories.of(user)[0][-recommender.max_history :] for user in users]  # type: ignore[index]
    out = [RecommendationQuery(row, k=3 + i, exclude_seen=i % 2 == 0) for i, row in enumerate(rows)]
    return [*out, RecommendationQuery([], k=4, exclude_seen=True)]


def batch_sizes(metrics: ServingMetrics) -> tuple[float, float]:
    """(model calls, requests scored) so far."""
    count = metrics.registry.get_sample_value("recsys_model_batch_size_count")
    total = metrics.registry.get_sample_value("recsys_model_batch_size_sum")
    return float(count or 0), float(total or 0)


async def run_concurrently(batcher: MicroBatcher, pairs: list[tuple[Recommender, RecommendationQuery]]) -> list:
    batcher.start()
    try:
        return await asyncio.gather(*(batcher.recommend(r, q) for r, q in pairs))
    finally:
        await batcher.stop()


def test_concurrent_requests_share_one_model_call_with_the_results_of_single_calls(recommender: Recommender) -> None:
    metrics = ServingMetrics()
    qs = queries(recommender)
    results = asyncio.run(run_concurrently(MicroBatcher(64, metrics), [(recommender, q) for q in qs]))
    assert batch_sizes(metrics) == (1, len(qs))  # all were waiting when the batcher woke: one call
    for query, result in zip(qs, results, strict=True):
        alone = recommender.recommend(query.history, query.k, query.exclude_seen)
        assert [r.item_id for r in result] == [r.item_id for r in alone]
        torch.testing.assert_close([r.score for r in result], [r.score for r in alone], rtol=1e-5, atol=1e-6)
        if query.exclude_seen and query.history:
            seen = {recommender.catalogue.item_ids[i - 1] for i in query.history}
            assert not seen & {r.item_id for r in result}


def test_batches_are_capped_at_max_batch(recommender: Recommender) -> None:
    metrics = ServingMetrics()
    qs = queries(recommender)  # 9 queries
    asyncio.run(run_concurrently(MicroBatcher(4, metrics), [(recommender, q) for q in qs]))
    assert batch_sizes(metrics) == (3, 9)  # 4 + 4 + 1


def test_requests_against_two_recommenders_are_never_scored_together(registry: tuple[str, str, Path]) -> None:
    """A hot swap mid-batch: each request is scored by the model it was parsed against."""
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None
    old, new = Recommender(bundle), Recommender(bundle)
    metrics = ServingMetrics()
    qs = queries(old)
    pairs = [(old if i % 2 else new, q) for i, q in enumerate(qs)]
    results = asyncio.run(run_concurrently(MicroBatcher(64, metrics), pairs))
    assert batch_sizes(metrics) == (2, len(qs))
    assert [len(r) for r in results] == [q.k for q in qs]


def test_a_request_outside_the_lifespan_is_refused_with_the_fix(recommender: Recommender) -> None:
    batcher = MicroBatcher(8, ServingMetrics())
    with pytest.raises(RuntimeError, match="create_app"):
        asyncio.run(batcher.recommend(recommender, RecommendationQuery([1], 3, True)))
