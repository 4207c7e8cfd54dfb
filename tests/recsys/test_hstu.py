"""HSTU: learns on the tiny synthetic data, scores by temperature-scaled cosine, saves and loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.registry import build_model, load_model, save_model
from recsys.training.trainer import TrainConfig, fit
from tests.conftest import popularity_valid_metric

EVAL = EvalConfig(ks=(10,), max_history=20)


def test_hstu_beats_popularity_on_the_tiny_data(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    model = HSTU(HSTUConfig(num_items=data.num_items, max_len=20, dim=32, num_heads=2, dropout=0.1))
    result = fit(model, data, TrainConfig(epochs=8, batch_size=4, lr=3e-3, progress=False), EVAL)
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"])
    baseline = popularity_valid_metric(data, EVAL)
    assert valid > 1.5 * baseline > 0


def test_scores_are_cosines_divided_by_the_temperature() -> None:
    model = HSTU(HSTUConfig(num_items=12, max_len=5, dim=8, num_heads=2, temperature=0.1)).eval()
    scores = model.score(torch.tensor([[0, 3, 4, 5]]))
    assert scores[:, 1:].abs().max() <= 10.0 + 1e-4  # |cosine| <= 1
    torch.testing.assert_close(model.item_embeddings().norm(dim=-1)[1:], torch.ones(12))


def test_registry_round_trip_keeps_the_scores(tmp_path: Path) -> None:
    model = build_model("hstu", {"max_len": 5, "dim": 8, "num_heads": 2}, num_items=12)
    assert isinstance(model, HSTU)
    save_model(tmp_path / "model.pt", "hstu", model)
    name, loaded = load_model(tmp_path / "model.pt")
    history = torch.tensor([[1, 2, 3]])
    assert name == "hstu"
    torch.testing.assert_close(loaded.score(history), model.eval().score(history))


def test_bad_temperature_is_refused() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        HSTU(HSTUConfig(num_items=3, temperature=0.0))
