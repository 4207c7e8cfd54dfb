"""The training-scale benchmark made tiny: it prepares its data once, streams an epoch from the parts, records the
figures, and reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.train_scale as train_scale
from benchmarks.reproduce import problems_of
from recsys.artifacts.model_dir import load_model_dir


def test_tiny_epoch_streams_the_parts_and_records_its_figures(tmp_path: Path) -> None:
    tiny = [
        "--set", "users=400", "--set", "items=300", "--set", f"data_dir={tmp_path}/data/{{users}}x{{items}}",
        "--set", "loss=sampled_softmax", "--set", "num_negatives=64", "--set", "valid_users=100",
        "--set", f"model_dir={tmp_path}/model",
        "--results-dir", str(tmp_path),
    ]  # fmt: skip
    first = json.loads(train_scale.main(tiny).read_text())
    assert first["data"]["prepare_seconds"] > 0 and first["data"]["users"] <= 400
    assert first["loss"] == "sampled_softmax (mixed negatives)"
    assert first["tokens"] > 400 and first["steps"] > 0 and first["tokens_per_second"] > 0
    assert 0 < first["read_and_pack_share"] < 1 and first["peak_rss_gib"] > 0
    assert first["sample_check"]["users (a seeded sample, not the protocol)"] == 100
    path = train_scale.main(tiny)  # the prepared directory is reused, and the epoch is the same
    second = json.loads(path.read_text())
    assert second["data"]["prepare_seconds"] is None and second["mean_loss"] == first["mean_loss"]
    assert problems_of(path) == []
    assert second["sparse_item_gradients"]  # the CPU default with the sampled softmax
    trained = load_model_dir(tmp_path / "model")  # written as `recsys train` writes one: it loads, data and all
    assert trained.model.config.num_items == first["data"]["items"] and trained.data.num_users == first["data"]["users"]
