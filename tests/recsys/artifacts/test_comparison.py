"""Evaluations with intervals and per-user ranks (the `evaluate` step), and challenger vs champion on them
(`recsys.artifacts.comparison`): two real tiny pipelines on the same data, and a refusal for different users."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.config import load_config
from pipelines.evaluate import baseline_comparison
from pipelines.runner import run_pipeline
from recsys.artifacts.comparison import compare_evaluation_dirs
from recsys.artifacts.evaluation_dir import EVALUATION_FILE
from recsys.artifacts.per_user import PER_USER_FILE, PerUserRanks
from recsys.errors import ConfigError, DataError
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


def test_a_comparison_of_named_slices_is_the_full_ones_on_those_slices(evaluations: dict[str, Path]) -> None:
    full = compare_evaluation_dirs(evaluations["challenger"], evaluations["champion"], FAST)
    some = compare_evaluation_dirs(evaluations["challenger"], evaluations["champion"], FAST, slices={"1", "10"})
    assert some["overall"] == full["overall"]
    assert list(some["slices"]) == ["popularity_decile"]  # the families without a named slice are left out
    assert some["slices"]["popularity_decile"] == [
        e for e in full["slices"]["popularity_decile"] if e["slice"] in {"1", "10"}
    ]
    with pytest.raises(ConfigError, match=r"no slice \['hot'\] in the evaluations\. Fix: one of \[.*'10'"):
        compare_evaluation_dirs(evaluations["challenger"], evaluations["champion"], FAST, slices={"hot"})


def test_evaluations_of_different_users_are_not_paired(evaluations: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"ranked different users or targets .* Fix: train both on the same data"):
        compare_evaluation_dirs(evaluations["other-data"], evaluations["champion"], FAST)


def test_a_slice_family_is_one_slice_per_user(evaluations: dict[str, Path]) -> None:
    ranks = PerUserRanks.read(evaluations["champion"] / PER_USER_FILE)
    names, codes = ranks.slices["cold_start"]
    assert names == ["warm", "cold"] and codes.dtype == torch.int16


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _without(*keys: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        with np.load(path) as stored:
            arrays = {key: stored[key] for key in stored.files if not key.startswith(keys)}
        np.savez(path, **arrays)

    return write


def _short_ranks(path: Path) -> None:
    with np.load(path) as stored:
        arrays = {key: stored[key] for key in stored.files}
    np.savez(path, **{**arrays, "ranks": arrays["ranks"][:10]})


def _json(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text) and None


CORRUPT = {  # (file, how it is spoilt, what the error says)
    "json-truncated": (EVALUATION_FILE, _truncated, r"not valid JSON: it ends in the middle of a value"),
    "json-binary": (EVALUATION_FILE, lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00"), "not UTF-8 text"),
    "json-not-json": (EVALUATION_FILE, _json("evaluation: yes"), r"not valid JSON \(Expecting value, line 1"),
    "json-a-list": (EVALUATION_FILE, _json("[1, 2, 3]"), "holds a JSON list, not the object expected"),
    "json-no-name": (EVALUATION_FILE, _json('{"split_digest": "ab", "users": 3}'), r"not an evaluation report .*name"),
    "json-ks-text": (EVALUATION_FILE, None, r"not an evaluation report .*protocol\.ks"),
    "npz-truncated": (PER_USER_FILE, _truncated, r"not a readable \.npz archive"),
    "npz-not-npz": (PER_USER_FILE, lambda p: p.write_text("ranks\n1\n2\n"), r"not an \.npz archive .*b'rank'"),
    "npz-no-ranks": (PER_USER_FILE, _without("ranks"), r"lacks the arrays \['ranks'\]"),
    "npz-no-slice-names": (PER_USER_FILE, _without("slice_names."), r"lacks the arrays \['slice_names\."),
    "npz-short-ranks": (PER_USER_FILE, _short_ranks, "its per-user arrays are not all of one length"),
}


def _spoil(source: Path, target: Path, case: str) -> Path:
    shutil.copytree(source, target)
    name, spoil, _ = CORRUPT[case]
    if spoil is None:  # a field of the wrong type
        report = json.loads((target / name).read_text())
        report["protocol"]["ks"] = "10"
        (target / name).write_text(json.dumps(report))
    else:
        spoil(target / name)
    return target


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_evaluation_is_an_error_naming_the_file(
    evaluations: dict[str, Path], tmp_path: Path, tiny_config: Callable[..., Path], case: str
) -> None:
    """Comparing with an evaluation directory whose evaluation.json or per_user.npz is spoilt (cut short, not JSON, JSON
    of another shape, arrays missing or of other lengths) is a DataError naming the file and the fix, both where the
    dashboard compares (`compare_evaluation_dirs`) and where `pipeline.compare_with` does (`baseline_comparison`)."""
    spoilt = _spoil(evaluations["champion"], tmp_path / "spoilt", case)
    name, _, problem = CORRUPT[case]
    expected = rf"{re.escape(str(spoilt / name))}: {problem}.*\. Fix: .*evaluat"
    with pytest.raises(DataError, match=expected):
        compare_evaluation_dirs(evaluations["challenger"], spoilt, FAST)
    config = load_config(tiny_config(tmp_path, pipeline={"compare_with": str(spoilt)}))
    with pytest.raises(DataError, match=expected):
        baseline_comparison(config, PerUserRanks.read(evaluations["challenger"] / PER_USER_FILE))


def test_pipeline_compare_with_a_truncated_evaluation_exits_2(evaluations: dict[str, Path], tmp_path: Path) -> None:
    """The real `recsys pipeline run` with `pipeline.compare_with` naming a cut-short evaluation.json: exit 2 and the
    error, no traceback (the steps before evaluate are up to date: skipped)."""
    spoilt = _spoil(evaluations["champion"], tmp_path / "spoilt", "json-truncated")
    work = evaluations["challenger"].parent.parent  # WORK/evaluations/challenger
    command = [str(Path(sys.executable).with_name("recsys")), "pipeline", "run", "--config",
               str(work / "challenger" / "tiny.yaml"), "--work-dir", str(work), "--until", "evaluate",
               "--set", f"pipeline.compare_with={spoilt}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert f"error: {spoilt / EVALUATION_FILE}: not valid JSON: it ends in the middle" in result.stderr
    assert "Traceback" not in result.stderr
