"""MoE vs dense ranking heads, expert balancing, and multi-task vs fewer tasks, with the library's ranker; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.moe_heads [--config benchmarks/configs/moe-heads.yaml] [--set KEY=VALUE ...]

The first stage (`retriever`, an experiment config) is trained once by the pipeline; then each variant of the
`ranker` config (its dotted overrides) runs through the pipeline's train and evaluate steps over that first stage:
task 0 ranks its top-C, the other tasks are those the data has (`recsys.data.tasks`: the synthetic data's purchases
and ratings). Reported per variant: test NDCG@10 / Recall@10 of the two stages (the same protocol as every model),
each task's AUC or RMSE on the users' held-out interactions (evaluation.json), the expert load of the last trained
epoch (busiest expert / even share; 1.0 = even), the head's active parameters and the median seconds per epoch.
Writes benchmarks/results/moe-heads-synthetic.json.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.quality import work_overrides
from pipelines.config import ExperimentConfig, load_config
from pipelines.evaluate import EVALUATION_FILE
from pipelines.runner import run_pipeline
from recsys.artifacts.model_dir import load_model_dir

logger = logging.getLogger(__name__)
WORK_DIR = Path(".cache/bench-moe")  # the default --work-dir


@dataclass(frozen=True)
class Settings:
    retriever: str  # experiment config of the first stage (a path in the repo)
    ranker: str  # experiment config of the ranker; its model.upstream.retriever becomes the first stage's model
    variants: dict[str, dict[str, Any]]  # label -> dotted overrides of the ranker config
    shared: dict[str, Any] = field(default_factory=dict)  # dotted overrides of both configs (one data set)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    for label, variant in settings.variants.items():  # every variant must be a valid ranker config
        variant_config(settings, label, variant, WORK_DIR)
    return settings


def variant_config(settings: Settings, label: str, overrides: dict[str, Any], work: Path) -> ExperimentConfig:
    """The ranker config of one variant, over the first stage trained in `work`, named after the variant."""
    retriever = load_config(REPO / settings.retriever, settings.shared)
    ranker = load_config(REPO / settings.ranker, settings.shared)
    return load_config(
        REPO / settings.ranker,
        {**settings.shared, **overrides, "name": f"{ranker.name}-{_slug(label)}",
         "model.upstream.retriever": str(work / "models" / retriever.name), **work_overrides(work)},
    )  # fmt: skip


def run_variant(config: ExperimentConfig, work: Path, data_dir: Path) -> dict[str, Any]:
    """Train and evaluate one variant through the pipeline on the first stage's data; its row of the report. It
    trains from scratch even when an earlier run trained it, so that every variant's time per epoch is measured in this
    run, beside the others."""
    outputs, _ = run_pipeline(config, work, until="evaluate", data_dir=data_dir, rerun=("train_retriever",))
    assert outputs.model is not None and outputs.evaluation is not None
    metrics = outputs.model.metrics
    evaluation = json.loads((outputs.evaluation.evaluation_dir / EVALUATION_FILE).read_text())
    ranker = load_model_dir(outputs.model.model_dir).model.ranker  # type: ignore[union-attr]
    load = metrics.get("expert_load") or []
    return {
        "config": config.model.params,
        "tasks": evaluation["tasks"],
        "test": {k: significant(metrics["test"][k]) for k in ("ndcg@10", "recall@10")},
        "valid_ndcg@10": significant(metrics["valid"]["ndcg@10"]),
        "expert_load_max_over_mean": significant(load[-1]["max_over_mean"]) if load else None,
        "head_active_parameters": ranker.head_parameters(),
        "seconds_per_epoch": significant(metrics["seconds_per_epoch"], 3),
        "best_epoch": metrics["best_epoch"],
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/moe-heads.yaml")
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR, help="data, models, MLflow")
    parser.add_argument("--name", default="moe-heads-synthetic", help="the result file's name")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    work = args.work_dir.resolve()
    retriever = load_config(REPO / settings.retriever, {**settings.shared, **work_overrides(work)})
    first, _ = run_pipeline(retriever, work, until="train_retriever")
    assert first.model is not None and first.data is not None
    rows = {}
    for label, variant in settings.variants.items():
        rows[label] = run_variant(variant_config(settings, label, variant, work), work, first.data.data_dir)
        logger.info("%s: %s", label, rows[label])
    result = {
        "settings": asdict(settings),
        "first_stage": {"config": settings.retriever, "test": first.model.metrics["test"]},
        "variants": rows,
        **provenance(),
    }
    path = write_result(args.name, result, args.results_dir, reproduce)
    _print_table(rows)
    print(f"-> {path}")
    return path


def _print_table(rows: dict[str, dict[str, Any]]) -> None:
    print("| variant | test N@10 | purchase AUC | rating RMSE | load max/mean | head params | s/epoch |")
    print("|---|---|---|---|---|---|---|")
    for label, row in rows.items():
        auc = row["tasks"].get("event:purchase", {}).get("auc")
        rmse = row["tasks"].get("value", {}).get("rmse")
        cells = [row["test"]["ndcg@10"], auc, rmse, row["expert_load_max_over_mean"], row["head_active_parameters"],
                 row["seconds_per_epoch"]]  # fmt: skip
        print(f"| {label} | " + " | ".join("-" if c is None else f"{c:.4g}" for c in cells) + " |")


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


if __name__ == "__main__":
    main()
