"""The synthetic-scale benchmark made tiny: every figure is recorded, the exact builder only up to its cap, and the
result reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.synthetic_scale as synthetic_scale
from benchmarks.reproduce import problems_of

TINY = [
    "--set", "catalogue_sizes=[300, 600]",
    "--set", "exact_max_items=300",
    "--set", "streams=[{users: 200, items: 300}]",
    "--set", "users_per_chunk=64",
]  # fmt: skip


def test_tiny_run_records_catalogue_times_and_the_stream(tmp_path: Path) -> None:
    path = synthetic_scale.main([*TINY, "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    small, large = result["catalogue"]
    assert small["items"] == 300 and {"catalog_s", "sampled_followups_s", "exact_followups_s"} <= small.keys()
    assert large["items"] == 600 and "exact_followups_s" not in large  # above exact_max_items
    (stream,) = result["streams"]
    assert stream["users"] == 200 and stream["interactions"] > 5 * 200  # at least min_length per user
    assert 0 < stream["rss_after_imports_gib"] <= stream["peak_rss_gib"] < 8
    assert stream["largest_chunk_mib"] > 0 and stream["parquet_gib"] > 0
    assert result["reproduce"]["config"] == "benchmarks/configs/synthetic-scale.yaml"
    assert problems_of(path) == []
