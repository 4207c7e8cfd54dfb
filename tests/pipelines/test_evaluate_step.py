"""The pipeline's `evaluate` step on the tiny synthetic data: evaluation.json with the slices, dashboard.html,
skipped when up to date, re-run when its output is gone; a query-aware model's search slices."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import pipelines.runner as runner
import pipelines.steps as steps
from pipelines.config import load_config
from pipelines.search import evaluate_query_scorer
from recsys.artifacts.evaluation_dir import DASHBOARD_FILE, EVALUATION_FILE
from recsys.artifacts.model_dir import load_model_dir
from recsys.evaluation.queries import LEVELS
from recsys.inference import QueryScorer
from tests.benchmarks.test_search_benchmark import PARAMS as QUERY_AWARE_PARAMS


def test_evaluate_writes_the_slices_and_is_skipped_when_up_to_date(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}, pipeline={"index": {"kind": "flat"}}))
    outputs, reports = runner.run_pipeline(config, tmp_path)
    assert steps.STEP_NAMES.index("build_index") + 1 == steps.STEP_NAMES.index("evaluate")
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


def test_a_query_aware_model_is_evaluated_on_the_search_protocol(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(
        tmp_path, name="tiny-query-aware", model={"name": "query_aware", "params": QUERY_AWARE_PARAMS},
        train={"schedule": {"epochs": 1}}, tracking={"enabled": False}, pipeline={"index": {"kind": "flat"}},
    ))  # fmt: skip
    outputs, _ = runner.run_pipeline(config, tmp_path)
    assert outputs.evaluation is not None and outputs.content is not None and outputs.model is not None
    report = json.loads((outputs.evaluation.evaluation_dir / EVALUATION_FILE).read_text())
    search = report["search"]
    assert search["users"] == report["users"] and set(search["queried"]) == set(LEVELS)
    assert all(0 < users <= search["users"] for users in search["queried"].values())
    tables = list(search["history_only"].values())
    for level in LEVELS:
        assert set(search["levels"][level]) == {"history+query", "no-history"}
        tables += [table for setting in search["levels"][level].values() for table in setting.values()]
    assert len(tables) == 1 + 2 * len(LEVELS)  # the query-aware model alone, in each of its settings
    assert all(0.0 <= value <= 1.0 for table in tables for value in table.values())

    # what the search benchmark's shared assembly gives for the same model and content directory
    trained = load_model_dir(outputs.model.model_dir)
    assert isinstance(trained.model, QueryScorer)
    cache = steps.ExperimentPaths.under(tmp_path, config).cache_dir  # the step's query embeddings, read back
    content_dir = outputs.content.path.parent
    expected = evaluate_query_scorer(trained.name, trained.model, trained.data, content_dir, config.eval, cache)
    assert {key: search[key] for key in expected.to_dict()} == json.loads(json.dumps(expected.to_dict()))
    page = (outputs.evaluation.evaluation_dir / DASHBOARD_FILE).read_text()
    assert 'id="chart-search"' in page and report["distill"] is None
