"""The search benchmark end to end on tiny synthetic models (a SASRec and a query-aware model trained here): every
system, level, setting and metric recorded, values in [0, 1], and the result reproducible from its smoke config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import benchmarks.search as search
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of
from pipelines.config import load_config
from pipelines.steps import ExperimentPaths
from recsys.artifacts.model_dir import load_model_dir
from recsys.evaluation.queries import LEVELS, catalogue_titles
from recsys.retrieval.lexical import BM25Retriever
from tests.conftest import train_experiment

SMOKE = "benchmarks/configs/search-smoke.yaml"
PARAMS = {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> dict[str, str]:
    """The benchmark's --set overrides naming a tiny SASRec's and a tiny query-aware model's directories."""
    work = tmp_path_factory.mktemp("search-benchmark")
    sasrec = load_config(tiny_config(work, tracking={"enabled": False}, train={"schedule": {"epochs": 1}}))
    query_aware = load_config(tiny_config(
        work, name="tiny-query-aware", model={"name": "query_aware", "params": PARAMS},
        train={"schedule": {"epochs": 1}}, tracking={"enabled": False},
    ))  # fmt: skip
    return {
        "sasrec_model_dir": str(train_experiment(sasrec, work).model_dir),
        "query_aware_model_dir": str(train_experiment(query_aware, work).model_dir),
        "content_dir": str(ExperimentPaths.under(work, query_aware).content_dir),
    }


def test_the_smoke_run_records_every_system_level_and_setting(model_dirs: dict[str, str], tmp_path: Path) -> None:
    sets = [arg for key, value in model_dirs.items() for arg in ("--set", f"{key}={value}")]
    path = search.main(["--config", str(REPO / SMOKE), *sets, "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path.name == "search-smoke.json"
    evaluation = result["evaluation"]
    metrics = {f"{name}@{k}" for name in ("recall", "ndcg") for k in (5, 10, 50)} | {"mrr"}
    users = result["data"]["test_users"]
    assert evaluation["users"] == users > 0 and set(evaluation["queried"]) == set(LEVELS)
    assert all(0 < count <= users for count in evaluation["queried"].values())
    assert set(evaluation["history_only"]) == {"sasrec", "query-aware"}
    tables = list(evaluation["history_only"].values())
    for level in LEVELS:
        settings = evaluation["levels"][level]
        assert set(settings["history+query"]) == {"query-aware"}
        assert set(settings["no-history"]) == {"bm25", "dense", "query-aware"}
        tables += [*settings["history+query"].values(), *settings["no-history"].values()]
    for table in tables:
        assert set(table) == metrics and all(0.0 <= value <= 1.0 for value in table.values())
    # titles name their items: three of a title's words find it far more often than chance (1 in 150 items)
    assert evaluation["levels"]["title-3"]["no-history"]["bm25"]["recall@10"] > 0.5
    assert evaluation["levels"]["title-3"]["no-history"]["dense"]["recall@10"] > 0.5
    assert all(len(result["examples"][level]) == 3 for level in LEVELS)
    assert result["reproduce"]["overrides"] == model_dirs
    assert problems_of(path) == []


def test_bm25_on_the_smoke_catalogue_ranks_each_item_first_for_its_full_title(model_dirs: dict[str, str]) -> None:
    titles = catalogue_titles(load_model_dir(Path(model_dirs["query_aware_model_dir"])).data.items)[1:]
    scores = BM25Retriever(titles).score(titles)  # (V, V+1)
    assert scores[:, 1:].argmax(dim=1).add(1).tolist() == list(range(1, len(titles) + 1))
