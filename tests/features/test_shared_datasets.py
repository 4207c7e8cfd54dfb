"""The real P5-form Amazon data in ../shared/data beside the repository (skipped when absent)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from features.loaders import load_amazon_p5
from features.prepare import build_prepared

# tests/features/<this file> -> parents[2] is the repository root; shared/ sits beside it.
SHARED_DATA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data").resolve()
BEAUTY = SHARED_DATA / "amazon-beauty"
SPORTS = SHARED_DATA / "amazon-sports"


@pytest.mark.skipif(not BEAUTY.is_dir(), reason=f"{BEAUTY} not found (shared data lives beside the repo)")
def test_beauty_counts_and_speed() -> None:
    start = time.perf_counter()
    raw = load_amazon_p5(BEAUTY)
    elapsed = time.perf_counter() - start
    assert raw.interactions.height == 198_502
    assert raw.interactions["user_id"].n_unique() == 22_363
    assert raw.interactions["item_id"].n_unique() == 12_101
    assert raw.items is not None and raw.items.height == 12_101
    assert elapsed < 5.0  # ~0.1 s in practice; generous for loaded CI machines
    prepared = build_prepared(raw)
    assert prepared.meta["counts"]["test"] == 22_363
    assert prepared.meta["counts"]["train"] == 198_502 - 2 * 22_363
    assert all(policy["count"] == 0 for policy in prepared.meta["policies"])  # 5-core: nothing to drop


@pytest.mark.skipif(not SPORTS.is_dir(), reason=f"{SPORTS} not found (shared data lives beside the repo)")
def test_sports_counts_without_catalog() -> None:
    raw = load_amazon_p5(SPORTS)
    assert raw.items is None
    assert raw.interactions.height == 296_337
    assert raw.interactions["user_id"].n_unique() == 35_598
    assert raw.interactions["item_id"].n_unique() == 18_357
