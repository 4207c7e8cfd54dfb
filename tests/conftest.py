"""Fixtures shared by every test folder: a tiny prepared synthetic dataset and a tiny experiment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from features.prepare import prepare
from features.sources import load_source

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
