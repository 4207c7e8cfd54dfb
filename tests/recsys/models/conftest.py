"""Fixtures of the model tests: a first stage trained briefly, for the rankers built on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig
from recsys.models.registry import save_model
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.trainer import fit
from tests.conftest import quick_train


@pytest.fixture(scope="module")
def retriever_dir(tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SASRec trained briefly on the tiny data, saved as a model directory's model.pt."""
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64))
    fit(model, data, quick_train(4, 4, 3e-3), EvalConfig(ks=(10,)))
    out = tmp_path_factory.mktemp("retriever")
    save_model(out / "model.pt", model)
    return out
