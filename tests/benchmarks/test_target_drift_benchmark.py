"""The target-drift benchmark on generated data: each split's decile shares and target counts, checked against the
prepared data's own sequences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from benchmarks import target_drift
from benchmarks.reproduce import problems_of

SYNTHETIC = "{label: synthetic, config: configs/synthetic/sasrec.yaml, data_path: null}"


def test_each_split_reports_its_targets_training_popularity(tmp_path: Path) -> None:
    path = target_drift.main(["--set", f"data=[{SYNTHETIC}]", "--set", f"work_dir={tmp_path / 'work'}",
                              "--set", "result_name=drift-test", "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())
    drift = result["data"]["synthetic"]
    (prepared,) = (tmp_path / "work" / "synthetic" / "data").iterdir()
    interactions = pl.read_parquet(prepared / "interactions.parquet").with_row_index()
    by_user = interactions.group_by("user_idx").agg(pl.col("item_idx").sort_by(["ts", "index"]))
    sequences = by_user["item_idx"].to_list()
    # leave-one-out: the last item is test's target, the one before validation's, the rest trains
    counts = np.bincount([i for s in sequences for i in s[:-2]], minlength=max(map(max, sequences)) + 1)
    predicted = {"training": [i for s in sequences for i in s[1:-2]], "valid": [s[-2] for s in sequences],
                 "test": [s[-1] for s in sequences]}  # fmt: skip
    for split, items in predicted.items():
        targets = counts[items]
        report = drift[split]
        assert report["targets"] == len(items)
        assert report["median_training_count"] == pytest.approx(np.quantile(targets, 0.5, method="lower"))
        assert report["mean_training_count"] == pytest.approx(targets.mean())
        assert report["never_trained_share"] == pytest.approx((targets == 0).mean())
        assert sum(report["decile_shares"].values()) == pytest.approx(1.0)
        assert list(report["decile_shares"]) == [str(d) for d in range(1, 11)]
    shift = drift["test_minus_valid_shares"]
    assert shift["10"] == pytest.approx(drift["test"]["decile_shares"]["10"] - drift["valid"]["decile_shares"]["10"])
    assert problems_of(path) == []
