"""HSTU: learns on the tiny synthetic data, scores by temperature-scaled cosine, saves and loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.registry import build_model, load_model, save_model
from recsys.training.trainer import fit
from tests.conftest import popularity_valid_metric, quick_train

EVAL = EvalConfig(ks=(10,))


def test_hstu_beats_popularity_on_the_tiny_data(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    model = HSTU(HSTUConfig(num_items=data.num_items, max_history=20, dim=32, num_heads=2, dropout=0.1))
    result = fit(
        model,
        data,
        quick_train(8, 4, 3e-3),
        EVAL,
    )
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"])
    baseline = popularity_valid_metric(data, EVAL)
    assert valid > 1.5 * baseline > 0


def test_scores_are_cosines_divided_by_the_temperature() -> None:
    model = HSTU(HSTUConfig(num_items=12, max_history=5, dim=8, num_heads=2, temperature=0.1)).eval()
    scores = model.score(torch.tensor([[0, 3, 4, 5]]))
    assert scores[:, 1:].abs().max() <= 10.0 + 1e-4  # |cosine| <= 1
    torch.testing.assert_close(model.item_embeddings().norm(dim=-1)[1:], torch.ones(12))


def test_inference_keeps_the_normalised_table_until_the_weights_change() -> None:
    model = HSTU(HSTUConfig(num_items=12, max_history=5, dim=8, num_heads=2)).eval()
    with torch.no_grad():
        table = model.item_embeddings()
        assert model.item_embeddings() is table  # once per state, not once per call
        model.item_emb.weight.mul_(3.0)  # an in-place write (what loading or an optimizer step does)
        moved = model.item_embeddings()
    assert moved is not table
    torch.testing.assert_close(moved, torch.nn.functional.normalize(model.item_emb.weight, dim=-1))
    assert model.item_embeddings().requires_grad  # with gradients recorded: computed, never the kept one


def test_registry_round_trip_keeps_the_scores(tmp_path: Path) -> None:
    model = build_model("hstu", {"max_history": 5, "dim": 8, "num_heads": 2}, num_items=12)
    assert isinstance(model, HSTU)
    save_model(tmp_path / "model.pt", model)
    name, loaded = load_model(tmp_path / "model.pt")
    history = torch.tensor([[1, 2, 3]])
    assert name == "hstu"
    torch.testing.assert_close(loaded.score(history), model.eval().score(history))


def test_bad_temperature_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"model\.params\.temperature: Input should be greater than 0"):
        build_model("hstu", {"temperature": 0.0}, num_items=3)


def _timed_hstu() -> HSTU:
    torch.manual_seed(0)
    model = HSTU(HSTUConfig(num_items=20, max_history=6, dim=16, num_heads=2, num_time_buckets=24)).eval()
    with torch.no_grad():
        for layer in model.layers:
            assert layer.time_bias is not None
            layer.time_bias.normal_()  # zero at initialisation: make the time bias matter here
    return model


def _at(times: list[int], request: int) -> HistoryTimes:
    return HistoryTimes(torch.tensor([times]), torch.tensor([request]))


def test_time_bias_reads_gaps_to_the_request_not_absolute_times() -> None:
    model = _timed_hstu()
    items = torch.tensor([[3, 4, 5, 6]])
    times = [1_000, 1_060, 90_000, 90_030]
    base = model.score(items, times=_at(times, 90_100))
    week = 7 * 86_400
    torch.testing.assert_close(model.score(items, times=_at([t + week for t in times], 90_100 + week)), base)
    assert not torch.allclose(model.score(items, times=_at(times, 90_100 + week)), base)  # back a week later
    assert not torch.allclose(model.score(items, times=_at([1_000, 80_000, 89_990, 90_030], 90_100)), base)


def test_time_aware_packed_rows_match_separate_histories() -> None:
    model = _timed_hstu()
    packed = model(
        torch.tensor([[3, 4, 5, 7, 8, 0]]),
        segments=torch.tensor([[1, 1, 1, 2, 2, 0]]),
        positions=torch.tensor([[3, 4, 5, 4, 5, 0]]),
        timestamps=torch.tensor([[10, 70, 9_000, 5, 100_000, 0]]),
        query_times=torch.tensor([[70, 9_000, 9_100, 100_000, 100_400, 0]]),  # each position's target time
    )
    first = model.encode_queries(torch.tensor([[3, 4, 5]]), times=_at([10, 70, 9_000], 9_100))
    second = model.encode_queries(torch.tensor([[0, 7, 8]]), times=_at([0, 5, 100_000], 100_400))  # left padding
    torch.testing.assert_close(packed[0, 2], first[0])
    torch.testing.assert_close(packed[0, 4], second[0])


def test_time_aware_histories_longer_than_max_history_keep_their_recent_times() -> None:
    model = _timed_hstu()
    items, times = torch.arange(1, 9)[None], (torch.arange(8) ** 3 * 100)[None]
    long = model.score(items, times=HistoryTimes(times, torch.tensor([60_000])))
    recent = model.score(items[:, -6:], times=HistoryTimes(times[:, -6:], torch.tensor([60_000])))
    torch.testing.assert_close(long, recent)


def test_time_aware_model_refuses_to_score_without_times() -> None:
    with pytest.raises(ValueError, match="num_time_buckets=24: pass the history's times"):
        _timed_hstu().score(torch.tensor([[1, 2]]))


def test_time_aware_hstu_trains_and_validates_on_real_times(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    config = HSTUConfig(num_items=data.num_items, max_history=20, dim=32, num_heads=2, dropout=0.1, num_time_buckets=24)
    model = HSTU(config)
    result = fit(
        model,
        data,
        quick_train(8, 4, 3e-3),
        EVAL,
    )
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"])
    assert valid > 1.5 * popularity_valid_metric(data, EVAL) > 0
    learned = torch.stack([layer.time_bias for layer in model.layers if layer.time_bias is not None])
    assert learned.abs().max() > 0  # the synthetic gaps (minutes within a session, days between) were read
