"""The time-buckets benchmark on two tiny trained HSTUs: slices by the request's gap and the learned bias."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pipelines.config import load_config
from tests.benchmarks.conftest import load_benchmark
from tests.conftest import train_experiment


def test_slices_cover_every_test_user_and_only_the_time_model_has_a_time_bias(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    work = tmp_path / "work"
    for name, buckets in (("synthetic-sessions-hstu", 0), ("synthetic-sessions-hstu-time", 16)):
        (tmp_path / name).mkdir()
        params = {"max_history": 20, "dim": 16, "num_heads": 2, "num_time_buckets": buckets}
        config = load_config(
            tiny_config(
                tmp_path / name,
                name=name,
                data={"options": {"num_users": 300, "num_items": 150, "session_reset_prob": 1.0}},
                model={"name": "hstu", "params": params},
                train={"epochs": 1},
                tracking={"enabled": False},
            )
        )
        train_experiment(config, work)
    path = load_benchmark("time_buckets.py").main(["--work-dir", str(work), "--results-dir", str(tmp_path)])
    models = json.loads(path.read_text())["models"]
    for row in models.values():
        assert row["same_session"]["users"] + row["new_session"]["users"] == row["all"]["users"] == 300
        assert 0 < row["new_session"]["users"] < 300
    assert models["positions"]["time_bias_layer1"] is None
    bias = models["positions + time buckets"]["time_bias_layer1"]
    assert len(bias) == 2 and len(bias[0]) == 16 and any(v != 0 for head in bias for v in head)  # trained: moved
