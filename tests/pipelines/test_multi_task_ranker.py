"""A multi-task MoE ranker through the whole pipeline: the first stage trained, the ranker trained on every task the
data has, evaluated with per-task metrics, registered, and served from its bundle."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.config import load_config
from pipelines.evaluate import EVALUATION_FILE
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.errors import ConfigError
from serving.recommender import Recommender
from tests.conftest import train_experiment


def test_a_multi_task_moe_ranker_is_trained_evaluated_per_task_and_registered(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    retriever = train_experiment(load_config(tiny_config(tmp_path, tracking={"enabled": False})), tmp_path)
    ranker = {
        "name": "ranker",
        "upstream": {"retriever": str(retriever.model_dir)},
        "params": {"num_candidates": 20, "dim": 32, "hidden": 32, "head": "moe", "num_experts": 4, "top_k": 2},
        "training": {"train_candidates": 10, "task_weights": {"value": 0.5}},
    }
    config = load_config(
        tiny_config(
            tmp_path,
            name="tiny-ranker",
            model=ranker,
            train={"schedule": {"epochs": 2}, "optimization": {"batch_size": 32}},
        )
    )
    outputs, reports = run_pipeline(config, tmp_path)
    assert {r.name: r.status for r in reports}["build_index"] == "not applicable"  # no item vectors to index
    assert outputs.evaluation is not None and outputs.registration is not None
    report = json.loads((outputs.evaluation.evaluation_dir / EVALUATION_FILE).read_text())
    tasks = report["tasks"]
    assert set(tasks) == {"event:purchase", "value"}  # every task the synthetic data has
    assert 0.0 <= tasks["event:purchase"]["auc"] <= 1.0 and tasks["event:purchase"]["users"] == report["users"]
    assert 0.0 < tasks["value"]["rmse"] < 4.0 and tasks["value"]["users"] == report["users"]
    assert len(report["expert_load"]) == 2  # one per trained epoch, for the dashboard
    recommender = Recommender(Bundle(outputs.registration.bundle_dir))
    assert recommender.name == "ranker" and [t.name for t in recommender.model.tasks] == ["event:purchase", "value"]
    assert len(recommender.recommend([1, 2, 3], k=5, exclude_seen=True)) == 5
    with pytest.raises(ConfigError, match=r"model\.training\.task_weights"):
        bad = {**ranker, "training": {"task_weights": {"value": "heavy"}}}
        load_config(tiny_config(tmp_path, name="tiny-ranker", model=bad))


def test_a_ranker_reads_the_items_category_paths_and_reports_each_levels_accuracy(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    categories = tmp_path / "item_categories.csv"  # every synthetic id and more (unknown ids are counted, not refused)
    rows = [f"i{n:05d},Top{n % 3} > Sub{n % 2}" for n in range(200)]
    categories.write_text("item_id,categories\n" + "\n".join(rows) + "\n")
    data = {"attributes": {"categories": str(categories)}}
    retriever = train_experiment(load_config(tiny_config(tmp_path, data=data, tracking={"enabled": False})), tmp_path)
    ranker = {
        "name": "ranker",
        "upstream": {"retriever": str(retriever.model_dir)},
        "params": {"num_candidates": 20, "dim": 32, "hidden": 32, "tasks": [], "use_categories": True,
                   "category_tasks": True, "category_levels": 3},
        "training": {"train_candidates": 10, "task_weights": {"category_l2": 0.5}},
    }  # fmt: skip
    config = load_config(
        tiny_config(tmp_path, name="tiny-ranker-categories", data=data, model=ranker,
                    train={"schedule": {"epochs": 1}, "optimization": {"batch_size": 32}})
    )  # fmt: skip
    outputs, _ = run_pipeline(config, tmp_path)
    assert outputs.evaluation is not None and outputs.registration is not None
    report = json.loads((outputs.evaluation.evaluation_dir / EVALUATION_FILE).read_text())
    assert set(report["tasks"]) == {"category_l1", "category_l2"}  # 3 asked, the paths have 2 levels
    for task in report["tasks"].values():
        assert 0.0 <= task["accuracy"] <= 1.0 and task["users"] == report["users"]  # every item has a path
    recommender = Recommender(Bundle(outputs.registration.bundle_dir))  # the table travels in the bundle
    assert recommender.model.category_tasks == ("category_l1", "category_l2")
    assert len(recommender.recommend([1, 2, 3], k=5, exclude_seen=True)) == 5
    with pytest.raises(ConfigError, match=r"data\.attributes\.categories"):
        no_paths = tiny_config(tmp_path, name="tiny-ranker-no-categories", model=ranker, tracking={"enabled": False})
        run_pipeline(load_config(no_paths), tmp_path)
