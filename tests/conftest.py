"""Fixtures shared by every test folder: a tiny prepared synthetic dataset, a tiny experiment, the popularity bar."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from features.prepare import prepare
from features.sources import load_source
from recsys.data.prepared import SequenceData
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.popularity import Popularity, PopularityConfig

TINY_SYNTHETIC = {"num_users": 300, "num_items": 150}


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared directory of a small synthetic dataset (shared, read-only for the tests)."""
    out = tmp_path_factory.mktemp("tiny") / "prepared"
    prepare(load_source("synthetic", None, seed=0, **TINY_SYNTHETIC), out)
    return out


def write_tiny_config(tmp_path: Path, **sections: dict) -> Path:
    """Write a fast SASRec experiment YAML on the tiny synthetic data; `sections` override keys."""
    config = {
        "name": "tiny-sasrec",
        "data": {"source": "synthetic", "options": dict(TINY_SYNTHETIC)},
        "model": {"name": "sasrec", "params": {"max_len": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64}},
        "train": {"epochs": 3, "batch_size": 8, "patience": 2, "progress": False},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., Path]:
    """`tiny_config(dir, train={"epochs": 2})` writes a fast experiment YAML into dir and returns its path."""
    return write_tiny_config


def popularity_valid_metric(data: SequenceData, eval_config: EvalConfig, metric: str = "ndcg@10") -> float:
    """`metric` of the most-popular baseline on `data`'s validation split: the bar a trained model must clear."""
    popularity = Popularity(PopularityConfig(data.num_items))
    popularity.fit(data.item_counts())
    return evaluate(popularity, data.eval_split("valid"), data.num_items, eval_config).metrics[metric]
