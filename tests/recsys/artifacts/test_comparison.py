"""Evaluations with intervals and per-user ranks (the `evaluate` step), and challenger vs champion on them
(`recsys.artifacts.comparison`): two real tiny pipelines on the same data, and a refusal for different users."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.comparison import compare_evaluation_dirs
from recsys.artifacts.evaluation_dir import EVALUATION_FILE
from recsys.artifacts.per_user import PER_USER_FILE, PerUserRanks
from recsys.errors import ConfigError
from recsys.evaluation import Uncertainty

FAST = Uncertainty(resamples=200)


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> dict[str, Path]:
    """Evaluation directories of two tiny SASRecs on the same data (seeds 0 and 1) and one on other data."""
    work = tmp_path_factory.mktemp("compare")
    out = {}
    for name, seed, users in (("champion", 0, 300), ("challenger", 1, 300), ("other-data", 0, 280)):
        config_dir = work / name
        config_dir.mkdir()
        path = tiny_config(config_dir, name=name, train={"schedule": {"epochs": 1}, "seed": seed},
                           data={"options": {"num_users": users, "num_items": 150}},
                           eval={"uncertainty": {"resamples": 200}}, tracking={"enabled": False})  # fmt: skip
        outputs, _ = run_pipeline(load_config(path), work, until="evaluate")
        assert outputs.evaluation is not None
        out[name] = outputs.evaluation.evaluation_dir
    return out


def test_the_evaluation_gives_every_metric_an_interval_and_keeps_the_per_user_ranks(
    evaluations: dict[str, Path],
) -> None:
    directory = evaluations["champion"]
    report = json.loads((directory / EVALUATION_FILE).read_text())
    assert report["uncertainty"] == {"method": "percentile bootstrap over users", "resamples": 200,
                                     "confidence": 0.95, "seed": 0}  # fmt: skip
    ranked = {m for m in report["overall"] if not m.startswith("coverage")}
    assert set(report["intervals"]) == ranked
    for metric, (low, high) in report["intervals"].items():
        assert low <= report["overall"][metric] <= high, metric
    for family, entries in report["slices"].items():
        for entry in entries:
            if entry["users"]:
                assert set(entry["intervals"]) == ranked, (family, entry["name"])
                assert all(low <= entry[m] <= high for m, (low, high) in entry["intervals"].items())

    ranks = PerUserRanks.read(directory / PER_USER_FILE)
    assert ranks.split_digest == report["split_digest"] and len(ranks.ranks) == report["users"] == 300
    with np.load(directory / PER_USER_FILE) as stored:
        assert stored["ranks"].dtype == np.int64 and stored["slice.popularity_decile"].dtype == np.int16
    for family, entries in report["slices"].items():
        masks = ranks.slice_masks(family)
        assert list(masks) == [entry["name"] for entry in entries]
        assert [int(mask.sum()) for mask in masks.values()] == [entry["users"] for entry in entries]
        assert bool((ranks.slices[family][1] >= 0).all())  # every user in one slice of every family


def test_challenger_vs_champion_gives_each_metric_and_slice_its_paired_difference(
    evaluations: dict[str, Path],
) -> None:
    comparison = compare_evaluation_dirs(evaluations["challenger"], evaluations["champion"], FAST)
    assert json.loads(json.dumps(comparison)) == comparison  # JSON-able as it is
    assert comparison["challenger"] == "challenger" and comparison["champion"] == "champion"
    assert (
        comparison["users"] == 300 and comparison["split"] == "test" and comparison["uncertainty"]["resamples"] == 200
    )
    reports = [json.loads((evaluations[n] / EVALUATION_FILE).read_text()) for n in ("challenger", "champion")]
    for metric, paired in comparison["overall"].items():
        assert set(paired) == {"difference", "low", "high", "p_value"}
        expected = reports[0]["overall"][metric] - reports[1]["overall"][metric]
        assert (
            paired["difference"] == pytest.approx(expected) and paired["low"] <= paired["difference"] <= paired["high"]
        )
        assert 0 < paired["p_value"] <= 1
    assert list(comparison["slices"]) == list(reports[0]["slices"])
    deciles = comparison["slices"]["popularity_decile"]
    assert [entry["slice"] for entry in deciles] == [str(d) for d in range(1, 11)]
    assert sum(entry["users"] for entry in deciles) == 300
    for entry in deciles:
        assert (entry["metrics"] == {}) == (entry["users"] == 0)
        assert all(set(m) == {"difference", "low", "high", "p_value"} for m in entry["metrics"].values())

    itself = compare_evaluation_dirs(evaluations["champion"], evaluations["champion"], FAST)["overall"]["ndcg@10"]
    assert itself == {"difference": 0.0, "low": 0.0, "high": 0.0, "p_value": 1.0}


def test_evaluations_of_different_users_are_not_paired(evaluations: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"ranked different users or targets .* Fix: train both on the same data"):
        compare_evaluation_dirs(evaluations["other-data"], evaluations["champion"], FAST)


def test_a_slice_family_is_one_slice_per_user(evaluations: dict[str, Path]) -> None:
    ranks = PerUserRanks.read(evaluations["champion"] / PER_USER_FILE)
    names, codes = ranks.slices["cold_start"]
    assert names == ["warm", "cold"] and codes.dtype == torch.int16
