"""The laboratory reads a result recorded before a config key moved under today's names."""

from __future__ import annotations

from benchmarks.moved import RENAMED_KEYS, current_record, renamed_key, renamed_keys
from pipelines.config import ExperimentConfig


def test_every_renamed_key_has_a_name_the_product_loads() -> None:
    today = ExperimentConfig(name="x").model_dump()
    for new in RENAMED_KEYS.values():
        tree = today
        for key in new.split("."):
            assert isinstance(tree, dict) and key in tree, f"{new} is not a key of today's configs"
            tree = tree[key]


def test_old_keys_of_a_record_are_read_under_their_new_names() -> None:
    assert renamed_key("train.max_train_seconds") == "train.schedule.max_seconds"
    assert renamed_key("sid.content.text_fields") == "content.text_fields"
    tree = {"train": {"lr": 0.01, "seed": 1}, "data": {"stream_parts": 2}, "sid": {"content": {"model": "m"}}}
    assert renamed_keys(tree) == {
        "train": {"seed": 1, "optimization": {"lr": 0.01}, "stream_parts": 2},
        "data": {},
        "sid": {},
        "content": {"model": "m"},
    }
    assert tree["train"] == {"lr": 0.01, "seed": 1}  # the record itself is left as it was
    record = {"benchmark": "benchmarks.quality", "config": "configs/beauty/sasrec.yaml", "overrides": {"train.lr": 1}}
    assert current_record(record)["overrides"] == {"train.optimization.lr": 1}
    nested = {"variants": {"a": {"train.lr": 0.1}}, "experiment": {"train.device": "cuda"}, "models": [{"x": 1}]}
    assert current_record({**record, "overrides": nested})["overrides"] == {
        "variants": {"a": {"train.optimization.lr": 0.1}},
        "experiment": {"train.hardware.device": "cuda"},
        "models": [{"x": 1}],
    }
