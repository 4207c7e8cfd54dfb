"""Pipeline step `evaluate`: the trained model on the test split once, sliced -> evaluation.json + dashboard.html.

The step loads the model directory, ranks every user's test target among all items (the protocol of
docs/training.md, the experiment's `eval` settings), and splits the users into the slice families of
`recsys.evaluation.slices` (cold-start targets, target popularity deciles, history length, target domain).
It writes, atomically, one evaluation directory:

    evaluation.json   the report: overall metrics and their intervals (`intervals`: {metric: [low, high]}, a
                      percentile bootstrap over users, how in `uncertainty`; coverage@k, a property of the whole
                      catalogue's lists, has none), per-slice metrics, intervals and user counts, the metrics of the
                      tasks beside ranking (multi-task models), semantic-ID health (when the model was built with
                      semantic IDs), the search protocol's slices by query difficulty (`search`: a model that
                      reads text queries, `pipelines.search`), the teacher and settings of a distilled student
                      (`distill`), the training run's validation/test metrics and the popularity baseline's
                      validation metrics (the champion gate's bar)
    dashboard.html    this run's evaluation dashboard (recsys.dashboard, plotly inlined, no network)
    per_user.npz      every user's test rank and slices (`recsys.artifacts.per_user`): what pairs two evaluations
                      (`recsys.artifacts.comparison`; evaluation.json's `split_digest` says which users they ranked)

and, with tracking on, logs them as artifacts `evaluation/` of an MLflow run `evaluate` (nested in the
pipeline's run), with the slice metrics as `slice.<family>_<slice>.<metric>` (e.g.
`slice.popularity_decile_3.ndcg_at_10`), the tasks' as `task.<task>.<metric>`, the search slices as
`search.levels.<level>.<setting>.<model family>.<metric>` and the overall ones as `test.<metric>` with their interval's
bounds as `test.<metric>.low` and `test.<metric>.high`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.distill import TEACHER_KEY
from pipelines.search import SEARCH_SEED, evaluate_query_scorer
from pipelines.tracking import flatten, start_tracking
from pipelines.train import CatalogFeatures, TrainOutputs
from recsys.artifacts.comparison import compare_ranks, read_evaluation_report
from recsys.artifacts.evaluation_dir import DASHBOARD_FILE, EVALUATE_RUN_NAME, EVALUATION_ARTIFACT_DIR, EVALUATION_FILE
from recsys.artifacts.model_dir import POPULARITY_VALID, TrainedModel, load_model_dir, model_sha256, trained_config_name
from recsys.artifacts.per_user import PER_USER_FILE, SEARCH_RANKS_FILE, PerUserRanks, SearchRanks, write_search_ranks
from recsys.dashboard import from_evaluation, render_dashboard
from recsys.data.splits import TEST, VALID
from recsys.enrich.report import metadata_summary
from recsys.errors import ConfigError
from recsys.evaluation import evaluate, evaluate_tasks
from recsys.evaluation.slices import flat_slice_metrics, slice_families, slice_report
from recsys.evaluation.uncertainty import metric_intervals
from recsys.inference import MultiTaskScorer, QueryScorer
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.device import resolve_device
from recsys.semantic_ids.codes import read_semantic_ids

logger = logging.getLogger(__name__)

SEARCH_METRICS = ("history_only", "levels", "queried")  # the search block's parts logged as MLflow metrics


@dataclass(frozen=True)
class EvaluateOutputs:
    evaluation_dir: Path  # evaluation.json (the whole report) and dashboard.html
    overall: dict[str, float]  # the test metrics
    slices: int  # slices measured, over every family
    run_id: str | None  # the MLflow run `evaluate`; None when tracking is off

    def summary(self) -> dict[str, object]:
        return {"evaluation_dir": self.evaluation_dir, "test_ndcg@10": self.overall.get("ndcg@10"),
                "slices": self.slices, "mlflow_run_id": self.run_id}  # fmt: skip


def evaluate_step(
    config: ExperimentConfig,
    model: TrainOutputs,
    out_dir: Path,
    features: CatalogFeatures | None = None,
    cache_dir: Path | None = None,
) -> EvaluateOutputs:
    """Evaluate the trained `model` on the test split with slices (a model that reads queries: and the search protocol);
    write `out_dir` (evaluation.json, dashboard.html).

    Args:
        config: the experiment (its `eval` section, its tracking).
        model: the train step's outputs: the model directory (its training data gives the split), the model file's
            SHA-256 and the MLflow run that trained it (recorded in the report).
        out_dir: the evaluation directory (replaced atomically when it holds an earlier evaluation).
        features: what earlier steps built: the model's semantic_ids.parquet (the semantic-ID health section), the
            content directory of its content_embeddings.npy (the search slices of a model that reads queries), the
            enrich step's item_metadata.parquet (the Metadata section).
        cache_dir: the embeddings cache the search queries are embedded through (None: no disk cache).
    """
    start = time.perf_counter()
    features = features or CatalogFeatures()
    trained = load_model_dir(model.model_dir)
    sha256, training_run_id = model.model_sha256, model.run_id
    with start_tracking(config.tracking, config.experiment_name, EVALUATE_RUN_NAME) as tracker:
        tracker.log_params(
            {"model_dir": str(model.model_dir), "model_sha256": sha256, "eval": asdict(config.eval),
             "semantic_ids": str(features.semantic_ids), "content_embeddings": str(features.content_embeddings),
             "training_run_id": str(training_run_id)}
        )  # fmt: skip
        report, per_user = evaluation_report(config, trained, features.semantic_ids)
        search, search_ranks = search_report(config, trained, features, cache_dir)
        report |= {"search": search, "distill": distill_report(config)}
        report["baseline"] = baseline_comparison(config, per_user)
        report["item_metadata"] = (  # the dashboard's Metadata section
            None if features.item_metadata is None else metadata_summary(features.item_metadata, trained.data.num_items)
        )
        training_metrics = {split: trained.metrics.get(split, {}) for split in (VALID, TEST, POPULARITY_VALID)}
        report |= {"model_sha256": sha256, "run_id": tracker.run_id,
                   "training": {"run_id": training_run_id, "metrics": training_metrics},
                   "expert_load": trained.metrics.get("expert_load")}  # fmt: skip
        write_evaluation(out_dir, report, per_user, search_ranks)
        tracker.log_metrics(report["overall"], prefix="test.")
        tracker.log_metrics(interval_metrics(report["intervals"]), prefix="test.")
        tracker.log_metrics(flat_slice_metrics(report["slices"]))
        tracker.log_metrics({f"task.{t}.{k}": v for t, m in report["tasks"].items() for k, v in m.items()})
        if report["search"] is not None:
            tracker.log_metrics(flatten({key: report["search"][key] for key in SEARCH_METRICS}, "search."))
        tracker.log_metrics({"evaluate_seconds": time.perf_counter() - start})
        tracker.log_artifacts(out_dir, artifact_path=EVALUATION_ARTIFACT_DIR)
    headline = ", ".join(f"{metric} {value:.4f}" for metric, value in report["overall"].items() if "@10" in metric)
    logger.info("evaluation of %s on %s: %s; written to %s (%.1f s)", trained.name, report["split"], headline, out_dir,
                time.perf_counter() - start)  # fmt: skip
    slices = sum(len(entries) for entries in report["slices"].values())
    return EvaluateOutputs(out_dir, report["overall"], slices, tracker.run_id)


def evaluation_report(
    config: ExperimentConfig, trained: TrainedModel, sid_path: Path | None
) -> tuple[dict[str, Any], PerUserRanks]:
    """Rank the test split once and slice it, with intervals, measure the tasks beside ranking: the JSON-able report
    without the run ids, and the per-user ranks it was computed from."""
    eval_config = config.eval
    model = trained.model.to(resolve_device(config.train.hardware.device))
    split = trained.data.eval_split(TEST)
    what = f"evaluation of {trained.name} on test, for the report (slices, intervals)"
    result = evaluate(model, split, trained.data.num_items, eval_config, what=what)
    families = slice_families(trained.data, split)
    tasks = evaluate_tasks(model, split, eval_config.batch_size) if isinstance(model, MultiTaskScorer) else {}
    per_user = PerUserRanks.of(result.ranks, split, families)
    uncertainty = eval_config.uncertainty
    report = {
        "name": config.name,
        "experiment": config.experiment_name,
        "model": trained.name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "split": TEST,
        "split_digest": per_user.split_digest,
        "protocol": {**asdict(eval_config), "ks": list(eval_config.ks), "max_history": model.max_history},
        "users": len(split.targets),
        "items": trained.data.num_items,
        "overall": result.metrics,
        "intervals": metric_intervals(result.ranks, eval_config.ks, uncertainty),
        "uncertainty": uncertainty.to_dict(),
        "slices": slice_report(result.ranks, families, eval_config.ks, uncertainty),
        "tasks": tasks,
        "semantic_ids": read_semantic_ids(sid_path)[1].to_dict() if sid_path is not None else None,
    }
    return report, per_user


def baseline_comparison(config: ExperimentConfig, per_user: PerUserRanks) -> dict[str, Any] | None:
    """This run minus `pipeline.compare_with`'s evaluation on the same test users (paired differences with intervals,
    overall and per slice); a warning when it is worse beyond the interval (a consumer that hurts); None without one."""
    baseline = config.pipeline.compare_with
    if baseline is None:
        return None
    path = baseline / EVALUATION_FILE
    if not path.is_file() or not (baseline / PER_USER_FILE).is_file():
        raise ConfigError(
            f"pipeline.compare_with {baseline} holds no evaluation ({EVALUATION_FILE} and {PER_USER_FILE}). Fix: run "
            "the baseline's pipeline to its evaluate step first, and name its WORK/evaluations/NAME directory"
        )
    uncertainty = config.eval.uncertainty
    if not uncertainty.resamples:
        raise ConfigError("pipeline.compare_with needs intervals. Fix: set eval.uncertainty.resamples (e.g. 1000)")
    names = (config.name, read_evaluation_report(baseline)["name"])
    comparison = compare_ranks(per_user, PerUserRanks.read(baseline / PER_USER_FILE), names, config.eval.ks,
                               uncertainty)  # fmt: skip
    metric = "ndcg@10" if "ndcg@10" in comparison["overall"] else next(iter(comparison["overall"]))
    headline = comparison["overall"][metric]
    if headline["high"] < 0:
        logger.warning("%s is worse than its baseline %s beyond the interval: %s %+.4f [%.4f, %.4f]", names[0],
                       names[1], metric, headline["difference"], headline["low"], headline["high"])  # fmt: skip
    return {"dir": str(baseline), **comparison}


def interval_metrics(intervals: dict[str, list[float]]) -> dict[str, float]:
    """{"<metric>.low": low, "<metric>.high": high} of a report's intervals, as MLflow metrics.

    Example:
        >>> interval_metrics({"ndcg@10": [0.1, 0.2]})
        {'ndcg@10.low': 0.1, 'ndcg@10.high': 0.2}
    """
    return {f"{metric}.{bound}": value for metric, (low, high) in intervals.items()
            for bound, value in (("low", low), ("high", high))}  # fmt: skip


def search_report(
    config: ExperimentConfig, trained: TrainedModel, features: CatalogFeatures, cache_dir: Path | None
) -> tuple[dict[str, Any] | None, SearchRanks]:
    """The search protocol on the test split of a model that reads text queries (`pipelines.search`: for each query
    level history+query and no-history, and history-only) with its seed, and the users' ranks behind it; (None, {})
    for any other model."""
    model = trained.model
    if not isinstance(model, QueryScorer):
        return None, {}
    if features.content_embeddings is None:
        raise ConfigError(
            f"{config.name}: the search evaluation of a model that reads queries reads its content directory, and "
            "none was built. Fix: run the pipeline's embed_content step (the model's family must read Input.QUERIES)"
        )
    content_dir = features.content_embeddings.parent
    evaluation = evaluate_query_scorer(trained.name, model, trained.data, content_dir, config.eval, cache_dir)
    return {**evaluation.to_dict(), "seed": SEARCH_SEED, "content_dir": str(content_dir)}, evaluation.ranks


def distill_report(config: ExperimentConfig) -> dict[str, Any] | None:
    """A distilled student's teacher (its config name, directory and weights digest) and distillation settings;
    None for a model trained without a teacher."""
    settings = config.distill
    if settings is None:
        return None
    teacher_dir = settings.teacher_dir
    return {"teacher": trained_config_name(teacher_dir), "teacher_dir": str(teacher_dir),
            "teacher_model_sha256": model_sha256(teacher_dir, TEACHER_KEY), "top_k": settings.top_k,
            "temperature": settings.temperature, "alpha": settings.alpha}  # fmt: skip


def write_evaluation(
    out_dir: Path, report: dict[str, Any], per_user: PerUserRanks, search_ranks: SearchRanks | None = None
) -> None:
    """evaluation.json, dashboard.html, per_user.npz and (a model that reads queries) search_ranks.npz, swapped in
    together (a crash leaves the previous ones or none)."""
    page = render_dashboard(from_evaluation(report, source=str(out_dir / EVALUATION_FILE)))
    with atomic_directory(out_dir, marker=EVALUATION_FILE) as tmp:
        (tmp / EVALUATION_FILE).write_text(json.dumps(report, indent=2) + "\n")
        (tmp / DASHBOARD_FILE).write_text(page)
        per_user.write(tmp / PER_USER_FILE)
        if search_ranks:
            write_search_ranks(tmp / SEARCH_RANKS_FILE, search_ranks)
