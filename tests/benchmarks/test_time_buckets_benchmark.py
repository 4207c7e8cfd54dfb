"""The time-buckets benchmark on the two HSTUs of its config, made tiny: slices by the request's gap and the learned
bias; the result reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.time_buckets as time_buckets
from benchmarks.reproduce import problems_of
from pipelines.config import load_config
from tests.conftest import train_experiment

TINY = {
    "data.options.num_users": 300,
    "data.options.num_items": 150,
    "model.params.max_history": 20,
    "model.params.dim": 16,
    "train.schedule.epochs": 1,
    "train.progress": False,
    "tracking.enabled": False,
}


def test_slices_cover_every_test_user_and_only_the_time_model_has_a_time_bias(tmp_path: Path) -> None:
    work = tmp_path / "work"
    for stem in ("sessions-hstu", "sessions-hstu-time"):
        config = f"benchmarks/configs/synthetic/{stem}.yaml"
        train_experiment(load_config(Path(config), TINY), work)
    path = time_buckets.main(["--work-dir", str(work), "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    models = result["models"]
    for row in models.values():
        assert row["same_session"]["users"] + row["new_session"]["users"] == row["all"]["users"] == 300
        assert 0 < row["new_session"]["users"] < 300
    assert models["positions"]["config"] == "benchmarks/configs/synthetic/sessions-hstu.yaml"
    assert models["positions"]["time_bias_layer1"] is None
    bias = models["positions + time buckets"]["time_bias_layer1"]
    assert len(bias) == 2 and len(bias[0]) == 32 and any(v != 0 for head in bias for v in head)  # trained: moved
    assert result["config"] == {"new_session_seconds": 3600, "split": "test", "ks": [10]}
    assert result["reproduce"] == {
        "benchmark": "benchmarks.time_buckets",
        "config": "benchmarks/configs/time-buckets.yaml",
        "overrides": {},
    }
    assert problems_of(path) == []


def test_a_model_without_a_time_bias_is_refused_by_name(tmp_path: Path) -> None:
    work = tmp_path / "work"
    sasrec = {**TINY, "name": "synthetic-sessions-hstu", "model.params": {"max_history": 20, "dim": 16}}
    train_experiment(load_config(Path("configs/synthetic/sasrec.yaml"), sasrec), work)
    with pytest.raises(SystemExit, match=r"a SASRec has no per-layer time bias \(layers\[0\]\.time_bias\)"):
        time_buckets.main(["--work-dir", str(work), "--results-dir", str(tmp_path)])
