"""The quality benchmark over seeds (the synthetic generative config, CPU): every seed's metrics, their mean and
sample std, and the means under `mean` as the Generative issue's results name them (`mean.test.recall@10`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import benchmarks.quality as quality
from benchmarks.reproduce import problems_of


def test_two_seeds_give_every_seed_and_the_means(tmp_path: Path) -> None:
    argv = ["--config", "configs/synthetic/generative.yaml", "--seeds", "2", "--work-dir", str(tmp_path / "work"),
            "--results-dir", str(tmp_path), "--set", "train.schedule.epochs=1"]  # fmt: skip
    path = quality.main(argv)
    assert problems_of(path) == []
    result = json.loads(path.read_text())
    seeds = result["seeds"]
    assert [run["seed"] for run in seeds] == [0, 1] and seeds[0]["test"] == result["metrics"]["test"]
    for split in ("valid", "test"):
        for metric, mean in result["mean"][split].items():
            assert mean == pytest.approx(statistics.fmean(run[split][metric] for run in seeds))
    recall = result["over_seeds"]["test"]["recall@10"]
    assert recall["mean"] == pytest.approx(result["mean"]["test"]["recall@10"]) and recall["seeds"] == 2
    assert result["seconds_per_epoch"] > 0 and result["device"] == "cpu"
