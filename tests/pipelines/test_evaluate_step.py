"""The pipeline's `evaluate` step on the tiny synthetic data: evaluation.json with the slices, dashboard.html,
skipped when up to date, re-run when its output is gone."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import pipelines.runner as runner
from pipelines.config import load_config
from pipelines.evaluate import DASHBOARD_FILE, EVALUATION_FILE


def test_evaluate_writes_the_slices_and_is_skipped_when_up_to_date(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}, pipeline={"index": {"kind": "flat"}}))
    outputs, reports = runner.run_pipeline(config, tmp_path)
    assert runner.STEP_NAMES.index("build_index") + 1 == runner.STEP_NAMES.index("evaluate")
    assert {r.name: r.status for r in reports}["evaluate"] == "ran"
    assert outputs.evaluation is not None and outputs.model is not None
    evaluation_dir = outputs.evaluation.evaluation_dir
    assert evaluation_dir == tmp_path / "evaluations" / "tiny-sasrec"
    report = json.loads((evaluation_dir / EVALUATION_FILE).read_text())

    # the test split evaluated once more gives the training step's test metrics
    trained_test = json.loads((outputs.model.model_dir / "metrics.json").read_text())["test"]
    assert report["overall"]["ndcg@10"] == pytest.approx(trained_test["ndcg@10"])
    assert report["model_sha256"] == outputs.model.model_sha256
    assert report["training"]["metrics"]["test"] == trained_test

    slices = {family: {e["name"]: e for e in entries} for family, entries in report["slices"].items()}
    assert list(slices) == ["cold_start", "popularity_decile", "history_length", "domain"]
    assert list(slices["popularity_decile"]) == [str(d) for d in range(1, 11)]
    assert list(slices["history_length"]) == ["1-2", "3-5", "6-10", "11-20", "21+"]
    assert set(slices["domain"]) == {"beauty", "sports", "home"}  # the synthetic data's domains
    for family, entries in slices.items():  # every family splits the 300 users
        assert sum(e["users"] for e in entries.values()) == report["users"] == 300, family
    top, bottom = slices["popularity_decile"]["10"], slices["popularity_decile"]["1"]
    assert top["users"] > 0 and top["recall@10"] > bottom.get("recall@10", 0.0)  # popular targets are easier
    warm = slices["cold_start"]["warm"]
    assert set(warm) >= {"users", "recall@5", "ndcg@10", "recall@50"} and report["semantic_ids"] is None
    assert report["tasks"] == {}  # SASRec ranks only
    page = (evaluation_dir / DASHBOARD_FILE).read_text()
    assert 'id="slices"' in page and page.count('class="plotly-graph-div"') == 5  # comparison + 4 families

    second = {r.name: r.status for r in runner.run_pipeline(config, tmp_path)[1]}
    assert second["evaluate"] == "skipped"
    shutil.rmtree(evaluation_dir)  # its output gone: the step runs again, nothing upstream does
    third = {r.name: r.status for r in runner.run_pipeline(config, tmp_path)[1]}
    assert third["evaluate"] == "ran" and third["train_retriever"] == third["build_index"] == "skipped"
    assert json.loads((evaluation_dir / EVALUATION_FILE).read_text())["slices"] == report["slices"]
