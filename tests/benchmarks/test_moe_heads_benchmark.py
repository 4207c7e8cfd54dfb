"""The MoE benchmark on a small synthetic data set: every variant runs through the pipeline and reports its ranking
metrics, its tasks' metrics and its expert load; the result reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.moe_heads as moe_heads
from benchmarks.reproduce import problems_of


def test_variants_report_ranking_tasks_and_expert_load(tmp_path: Path) -> None:
    small = "{data.options.num_users: 200, data.options.num_items: 100, train.schedule.epochs: 1}"
    variants = "{moe: {}, dense: {model.params.head: dense, model.params.hidden: 96, model.params.tasks: [value]}}"
    args = ["--set", f"shared={small}", "--set", f"variants={variants}", "--work-dir", str(tmp_path / "work"),
            "--results-dir", str(tmp_path)]  # fmt: skip
    path = moe_heads.main(args)
    result = json.loads(path.read_text())
    moe, dense = result["variants"]["moe"], result["variants"]["dense"]
    assert set(moe["tasks"]) == {"event:purchase", "value"} and set(dense["tasks"]) == {"value"}
    assert 0.0 <= moe["tasks"]["event:purchase"]["auc"] <= 1.0 and moe["tasks"]["value"]["rmse"] > 0
    assert moe["expert_load_max_over_mean"] >= 1.0 and dense["expert_load_max_over_mean"] is None
    assert moe["head_active_parameters"] > 0 and dense["head_active_parameters"] > 0
    assert 0.0 <= moe["test"]["ndcg@10"] <= 1.0
    assert result["reproduce"]["benchmark"] == "benchmarks.moe_heads"
    assert result["reproduce"]["config"] == "benchmarks/configs/moe-heads.yaml"
    assert problems_of(path) == []
