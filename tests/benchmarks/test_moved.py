"""The laboratory reads a result recorded before a config key moved under today's names."""

from __future__ import annotations

import importlib
import importlib.util

from benchmarks.moved import RENAMED_BENCHMARKS, RENAMED_KEYS, config_path, current_record, renamed_key, renamed_keys
from pipelines.config import ExperimentConfig
from recsys.models.family import UPSTREAM_KEY
from recsys.models.registry import family_names, model_family


def test_every_renamed_key_has_a_name_the_product_loads() -> None:
    today = ExperimentConfig(name="x").model_dump()
    roles = {role.key for name in family_names() for role in model_family(name).upstream}
    for new in RENAMED_KEYS.values():
        if new.startswith(f"{UPSTREAM_KEY}."):  # a role some family declares
            assert new in roles, f"{new} is the role of no model family"
            continue
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


def test_upstream_keys_of_a_record_are_roles_of_model_upstream() -> None:
    assert renamed_key("model.retriever_dir") == "model.upstream.retriever"
    recorded = {"model": {"name": "ranker", "retriever_dir": "r", "holdout_retriever_dir": None, "members": []}}
    assert renamed_keys(recorded) == {"model": {"name": "ranker", "upstream": {"retriever": "r"}}}


def test_a_recorded_config_path_is_read_where_the_config_is_today() -> None:
    assert config_path("configs/benchmarks/beauty-ranking.yaml") == "benchmarks/configs/beauty-ranking.yaml"
    assert config_path("configs/beauty/tiger.yaml") == "benchmarks/configs/beauty/tiger.yaml"  # an experiment
    assert config_path("configs/beauty/sasrec.yaml") == "configs/beauty/sasrec.yaml"  # a config a user starts from
    assert config_path("configs/beauty/nowhere.yaml") == "configs/beauty/nowhere.yaml"  # the check says it is missing
    record = {
        "benchmark": "b",
        "config": "configs/benchmarks/x.yaml",
        "overrides": {"models": [{"config": "configs/sports/hstu.yaml"}]},
    }
    assert current_record(record) == {
        "benchmark": "b",
        "config": "benchmarks/configs/x.yaml",
        "overrides": {"models": [{"config": "benchmarks/configs/sports/hstu.yaml"}]},
    }


def test_a_recorded_benchmark_module_is_read_under_its_name_of_today() -> None:
    record = {"benchmark": "benchmarks.generative_popularity", "config": "benchmarks/configs/x.yaml", "overrides": {}}
    assert current_record(record)["benchmark"] == "benchmarks.generative_decoding"
    for old, new in RENAMED_BENCHMARKS.items():  # the new module is there to run, the old one is gone
        assert callable(importlib.import_module(new).main)
        assert importlib.util.find_spec(old) is None
