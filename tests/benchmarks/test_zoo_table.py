"""The Retrieval-zoo table: one row per model from the quality JSONs; a missing JSON stops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark


def quality_json(ndcg10: float, budget: str | None = None) -> dict:
    return {
        "metrics": {"test": {"recall@5": 0.05, "ndcg@5": 0.03, "recall@10": 0.08, "ndcg@10": ndcg10}},
        "train_seconds": 120.0,
        "seconds_per_epoch": 4.0,
        "best_epoch": 7,
        "overrides": [f"train.max_train_seconds={budget}"] if budget else [],
        "device": "cpu",
        "machine": {"cpu_cores": 2},
    }


def test_table_has_every_model_with_its_figures_and_budget(tmp_path: Path) -> None:
    zoo = load_benchmark("zoo_table.py")
    for rows in zoo.TABLES.values():
        for i, (_, config) in enumerate(rows):
            budget = "100" if i == 2 else "900" if i else None
            (tmp_path / f"{config}.json").write_text(json.dumps(quality_json(0.01 * (i + 1), budget)))
    result = json.loads(zoo.main(["--results-dir", str(tmp_path)]).read_text())
    beauty = result["tables"]["amazon-beauty"]
    assert [r["model"] for r in beauty] == [label for label, _ in zoo.TABLES["amazon-beauty"]]
    assert beauty[1]["ndcg@10"] == 0.02 and beauty[1]["time_boxed"] is None  # 120 s of a 900 s budget: not boxed
    assert beauty[0]["time_boxed"] is None
    assert beauty[2]["time_boxed"] == "100 s"  # 120 s trained on a 100 s budget: the budget stopped it
    assert beauty[0]["device"] == "CPU, 2 cores"


def test_a_missing_result_is_an_error_that_names_the_config(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"beauty-popularity\.json is missing"):
        load_benchmark("zoo_table.py").main(["--results-dir", str(tmp_path)])
