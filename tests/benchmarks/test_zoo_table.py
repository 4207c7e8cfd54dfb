"""The Retrieval-zoo table: one row per model of its config from the quality JSONs, each naming its experiment
config in the repo; a missing JSON stops it; the table reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import benchmarks.zoo_table as zoo
from benchmarks.reproduce import problems_of

CONFIG = Path("benchmarks/configs/retrieval-zoo.yaml")


def quality_json(ndcg10: float, budget: int | None = None, reproduce: dict[str, Any] | None = None) -> dict:
    result = {
        "metrics": {"test": {"recall@5": 0.05, "ndcg@5": 0.03, "recall@10": 0.08, "ndcg@10": ndcg10}},
        "train_seconds": 120.0,
        "seconds_per_epoch": 4.0,
        "best_epoch": 7,
        "device": "cpu",
        "machine": {"cpu_cores": 2},
    }
    if reproduce is not None:  # results of the converted benchmarks.quality: the budget in `reproduce`
        overrides = {} if budget is None else {"train.max_train_seconds": budget}
        return {**result, "reproduce": {**reproduce, "overrides": overrides}}
    return {**result, "overrides": [f"train.max_train_seconds={budget}"] if budget else []}  # earlier ones


def test_table_has_every_model_with_its_figures_config_and_budget(tmp_path: Path) -> None:
    settings = zoo.load_settings(CONFIG, {})
    hstu = {"benchmark": "benchmarks.quality", "config": "configs/beauty/hstu.yaml"}
    for rows in settings.tables.values():
        for i, row in enumerate(rows):
            budget = 100 if i in (2, 4) else 900 if i else None
            reproduce = hstu if i in (3, 4) else None  # row 3 made from another config than its name says
            (tmp_path / f"{row.result}.json").write_text(json.dumps(quality_json(0.01 * (i + 1), budget, reproduce)))
    path = zoo.main(["--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    beauty = result["tables"]["amazon-beauty"]
    assert [r["model"] for r in beauty] == [row.label for row in settings.tables["amazon-beauty"]]
    assert beauty[1]["ndcg@10"] == 0.02 and beauty[1]["time_boxed"] is None  # 120 s of a 900 s budget: not boxed
    assert beauty[0]["time_boxed"] is None
    assert beauty[2]["time_boxed"] == "100 s"  # 120 s trained on a 100 s budget: the budget stopped it
    assert beauty[4]["time_boxed"] == "100 s"  # the same, read from `reproduce`
    assert beauty[0]["device"] == "CPU, 2 cores"
    assert beauty[1]["config"] == "configs/beauty/sasrec.yaml"  # from the result's name
    assert beauty[3]["config"] == "configs/beauty/hstu.yaml"  # from the result's `reproduce`
    assert result["tables"]["amazon-sports"][0]["config"] == "benchmarks/configs/sports/popularity.yaml"
    assert result["reproduce"] == {"benchmark": "benchmarks.zoo_table", "config": str(CONFIG), "overrides": {}}
    assert problems_of(path) == []


def test_a_missing_result_is_an_error_that_names_the_config(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"beauty-popularity\.json is missing.*configs/beauty/popularity\.yaml"):
        zoo.main(["--results-dir", str(tmp_path)])
