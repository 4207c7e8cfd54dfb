"""The bootstrap-cost benchmark at a small size: both calls timed, the JSON reproducible from its config."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.bootstrap_cost as bootstrap_cost
from benchmarks.reproduce import problems_of


def test_the_intervals_cost_is_measured_and_recorded(tmp_path: Path) -> None:
    sets = ["users=500", "items=100", "resamples=50", "repeats=1"]
    path = bootstrap_cost.main([arg for s in sets for arg in ("--set", s)] + ["--results-dir", str(tmp_path)])

    result = json.loads(path.read_text())
    assert result["metrics"] == ["recall@5", "ndcg@5", "recall@10", "ndcg@10", "recall@50", "ndcg@50", "mrr"]
    assert set(result["median_seconds"]) == {"bootstrap_intervals", "paired_difference"}
    assert all(seconds > 0 for seconds in result["median_seconds"].values())
    assert problems_of(path) == []
