"""What the evaluation dashboard shows, gathered from an MLflow store (or from one evaluation report).

From MLflow (`from_mlflow`): every training run (a run that logged its model config and the standard metrics valid/test
recall@k and ndcg@k: run name, model, the params of its model, start time, the 95 % intervals its pipeline's `evaluate`
run logged), for each experiment the latest `evaluate` run's `evaluation/evaluation.json` artifact (the slices, search
slices and semantic-ID health written by `pipelines.evaluate`), a distilled student's right after its teacher's; the
trend of every `evaluate` run's test metric and whether its pipeline's registration promoted it; and the newest
challenger against the champion, user by user (`recsys.artifacts.comparison`). A run's steps are nested runs of its
pipeline's run, which ties a training run, its evaluation and its registration together. From one report
(`from_evaluation`): the same page for a single pipeline run, which the `evaluate` step writes as `dashboard.html`
beside its `evaluation.json`.

MLflow is imported only when the store is read (it is slow to import).
"""

from __future__ import annotations

import logging
import re
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recsys.artifacts.comparison import compare_evaluation_dirs
from recsys.artifacts.evaluation_dir import EVALUATE_RUN_NAME, EVALUATION_ARTIFACT, EVALUATION_ARTIFACT_DIR
from recsys.artifacts.registry import PARENT_TAG, PROMOTED_TAG, sqlite_path
from recsys.errors import RecsysError
from recsys.runtime.json_files import read_json_object

logger = logging.getLogger(__name__)

# MLflow names of the standard metrics: valid_recall_at_10, test_ndcg_at_50, ... (pipelines/tracking.py)
STANDARD_METRIC = re.compile(r"^(valid|test)_(recall|ndcg)_at_(\d+)$")
SHOWN_PARAMS = (
    "data.source",
    "train.schedule.epochs",
    "train.optimization.batch_size",
    "train.optimization.lr",
    "model.training.loss",
)
FITTED_PARAMS = ("data.source",)  # of a model fitted without gradient steps (popularity: no epochs, lr, loss)
TREND_METRIC = "ndcg@10"  # the trend's and the champion comparison's headline metric
STALE_AFTER_HOURS = 24  # a run still RUNNING this long after its start has most likely died without ending


class DashboardUnavailable(RecsysError):
    """The dashboard's MLflow store cannot be read; the message says how to point it at one."""


@dataclass(frozen=True)
class RunSummary:
    """One training run, as the runs table and the comparison chart show it.

    Args:
        metrics: the standard metrics as "valid/recall@10", "test/ndcg@50", ... -> value.
        params: the `SHOWN_PARAMS` the run logged.
    """

    run_id: str
    name: str
    experiment: str
    model: str
    status: str
    start_time: datetime | None
    metrics: dict[str, float]
    params: dict[str, str] = field(default_factory=dict)
    # "test/ndcg@10" -> its 95 % interval, from the evaluate run of the same pipeline run (empty: none logged)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """A short, unique legend entry: name, model and the run id's first characters."""
        return f"{self.name} ({self.model}, {self.run_id[:6]})"

    def shown_status(self, now: datetime) -> str:
        """The status, with RUNNING runs older than `STALE_AFTER_HOURS` marked as most likely dead."""
        stale = self.start_time is not None and (now - self.start_time).total_seconds() > STALE_AFTER_HOURS * 3600
        return f"{self.status} (stale?)" if self.status == "RUNNING" and stale else self.status


@dataclass(frozen=True)
class TrendPoint:
    """One evaluate run's headline test metric, with its interval, and what the champion gate made of its model."""

    run_id: str
    name: str
    experiment: str
    start_time: datetime
    value: float
    interval: tuple[float, float] | None
    promoted: bool | None  # None: its pipeline registered no version (or the run predates the gate's tag)


@dataclass(frozen=True)
class Evaluation:
    """One `evaluate` step's report (the contents of evaluation.json) and the run that logged it."""

    report: dict[str, Any]
    experiment: str
    run_id: str | None = None
    start_time: datetime | None = None

    @property
    def name(self) -> str:
        return str(self.report.get("name", "?"))

    @property
    def teacher(self) -> str | None:
        """The config name of the teacher a distilled student learnt from (the report's `distill`); None otherwise."""
        distill = self.report.get("distill") or {}
        return None if distill.get("teacher") is None else str(distill["teacher"])

    @property
    def label(self) -> str:
        """The legend entry: name, model (a distilled student: whose student) and the run id's first characters."""
        model = str(self.report.get("model", "?")) + (f", student of {self.teacher}" if self.teacher else "")
        return f"{self.name} ({model}{', ' + self.run_id[:6] if self.run_id else ''})"


@dataclass(frozen=True)
class DashboardData:
    """Everything one dashboard page shows.

    Args:
        title: the page heading.
        source: where it came from (a tracking URI with any password hidden, or a file).
        runs: training runs, newest first.
        evaluations: evaluate reports, newest first.
        notes: what could not be read (shown on the page, never an error page).
        hint: the command that adds runs to this source (used by the empty states).
        trend: every evaluate run's `TREND_METRIC` on test, oldest first.
        comparison: the newest challenger against the champion (`recsys.artifacts.comparison.compare_evaluation_dirs`'s
            report); None when there is no champion or no other evaluation to compare.
    """

    title: str
    source: str
    runs: list[RunSummary]
    evaluations: list[Evaluation]
    notes: list[str] = field(default_factory=list)
    trend: list[TrendPoint] = field(default_factory=list)
    comparison: dict[str, Any] | None = None
    hint: str = "recsys pipeline run --config configs/synthetic/sasrec.yaml --work-dir runs"
    generated: datetime = field(default_factory=lambda: datetime.now(UTC))


def redact_uri(uri: str) -> str:
    """The URI with any password replaced by ***, safe to show on a page.

    Example:
        >>> redact_uri("postgresql+psycopg2://mlflow:secret@db:5432/mlflow")
        'postgresql+psycopg2://mlflow:***@db:5432/mlflow'
    """
    return re.sub(r"(//[^/:@]+):[^/@]*@", r"\1:***@", uri)


def standard_metrics(mlflow_metrics: dict[str, float]) -> dict[str, float]:
    """The standard metrics among a run's MLflow metrics, renamed "split/metric@k".

    Example:
        >>> standard_metrics({"test_ndcg_at_10": 0.1, "valid_recall_at_5": 0.2, "train_seconds": 3.0})
        {'test/ndcg@10': 0.1, 'valid/recall@5': 0.2}
    """
    out = {}
    for name, value in mlflow_metrics.items():
        if match := STANDARD_METRIC.match(name):
            split, metric, k = match.groups()
            out[f"{split}/{metric}@{k}"] = float(value)
    return out


def from_evaluation(report: dict[str, Any], source: str) -> DashboardData:
    """The page of one pipeline run: its training metrics (from the report) and its evaluation."""
    training = report.get("training", {})
    metrics = {
        f"{split}/{name}": float(value)
        for split in ("valid", "test")
        for name, value in training.get("metrics", {}).get(split, {}).items()
        if name.startswith(("recall@", "ndcg@"))
    }
    run = RunSummary(
        run_id=str(training.get("run_id") or "local"),
        name=str(report.get("name", "?")),
        experiment=str(report.get("experiment", "?")),
        model=str(report.get("model", "?")),
        status="FINISHED",
        start_time=_parse_time(report.get("created")),
        metrics=metrics,
    )
    evaluation = Evaluation(report, run.experiment, report.get("run_id"), run.start_time)
    return DashboardData(title=f"Evaluation of {run.name}", source=source, runs=[run], evaluations=[evaluation])


def from_mlflow(tracking_uri: str, experiment: str | None = None, *, max_runs: int = 200) -> DashboardData:
    """Training runs and the latest evaluation of each experiment in the store at `tracking_uri`.

    Args:
        tracking_uri: the MLflow store (SQLite file, PostgreSQL, ...).
        experiment: only this experiment (by name); None = every experiment of the store.
        max_runs: at most this many of the newest runs are read.

    Raises:
        DashboardUnavailable: a SQLite store whose file does not exist (reading would create an empty one),
            or a store that does not answer.
    """
    source = redact_uri(tracking_uri)
    _check_sqlite_exists(tracking_uri)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri)
        experiments = {e.experiment_id: e.name for e in client.search_experiments()}
        title = "Offline evaluation"
        notes: list[str] = []
        if experiment is not None:
            title = f"Offline evaluation: {experiment}"
            experiments = {i: name for i, name in experiments.items() if name == experiment}
            if not experiments:
                notes.append(f"no experiment named {experiment!r} in this store; open /dashboard for all of them")
        runs = (
            client.search_runs(list(experiments), max_results=max_runs, order_by=["attributes.start_time DESC"])
            if experiments
            else []
        )
    except MlflowException as err:
        raise DashboardUnavailable(
            f"the MLflow store at {source} could not be read ({err}). "
            "Fix: check the tracking URI (--tracking-uri or RECSYS_TRACKING_URI) and that the store answers"
        ) from err
    evaluate_runs = {
        run.data.tags[PARENT_TAG]: run
        for run in runs
        if run.info.run_name == EVALUATE_RUN_NAME and run.info.status == "FINISHED" and PARENT_TAG in run.data.tags
    }
    summaries = [_summary(run, experiments, evaluate_runs) for run in runs if _is_training_run(run)]
    evaluations = students_beside_teachers(_latest_evaluations(runs, experiments, tracking_uri, notes))
    trend = _trend(runs, experiments)
    comparison = _champion_comparison(runs, trend, tracking_uri, notes)
    return DashboardData(title=title, source=source, runs=summaries, evaluations=evaluations, notes=notes,
                         trend=trend, comparison=comparison)  # fmt: skip


def students_beside_teachers(evaluations: list[Evaluation]) -> list[Evaluation]:
    """`evaluations` in their order, except that each distilled student comes right after its teacher's evaluation
    when that is among them (the slice charts then show teacher and student side by side)."""
    names = {evaluation.name for evaluation in evaluations}
    order: list[int] = []  # indices into `evaluations`

    def place(i: int) -> None:
        order.append(i)
        for j, student in enumerate(evaluations):
            if student.teacher == evaluations[i].name and j not in order:
                place(j)

    for i, evaluation in enumerate(evaluations):
        if i not in order and evaluation.teacher not in names:
            place(i)
    order += [i for i in range(len(evaluations)) if i not in order]  # students in a cycle of teachers
    return [evaluations[i] for i in order]


def _check_sqlite_exists(tracking_uri: str) -> None:
    path = sqlite_path(tracking_uri)
    if path is not None and not path.is_file():
        raise DashboardUnavailable(
            f"there is no MLflow store at {path} (from the tracking URI {tracking_uri}). Fix: pass "
            "the store your pipelines log to (tracking.uri of the config), e.g. `recsys serve --model-name "
            "NAME --tracking-uri sqlite:///ABSOLUTE/PATH/mlflow.db`"
        )


def _is_training_run(run: Any) -> bool:
    """A run of `pipelines.train.train_step`: it logged the model config and standard metrics (the champion
    gate's register runs log valid_ndcg_at_10 too, but no model)."""
    return "model.name" in run.data.params and bool(standard_metrics(run.data.metrics))


def _shown(params: dict[str, str], shown: tuple[str, ...]) -> dict[str, str]:
    """The `shown` params a run logged."""
    return {key: params[key] for key in shown if key in params}


def _summary(run: Any, experiments: dict[str, str], evaluate_runs: dict[str, Any]) -> RunSummary:
    params = run.data.params
    shown = SHOWN_PARAMS if run.data.metrics.get("best_epoch", 0) > 0 else FITTED_PARAMS
    evaluated = evaluate_runs.get(run.data.tags.get(PARENT_TAG, ""))
    return RunSummary(
        run_id=run.info.run_id,
        name=run.info.run_name or run.info.run_id,
        experiment=experiments.get(run.info.experiment_id, run.info.experiment_id),
        model=params.get("model.name", "?"),
        status=run.info.status,
        start_time=_from_millis(run.info.start_time),
        metrics=standard_metrics(run.data.metrics),
        params=_shown(params, shown),
        intervals={} if evaluated is None else logged_intervals(evaluated.data.metrics),
    )


def logged_intervals(mlflow_metrics: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The test intervals an evaluate run logged (`test.<metric>.low` / `.high`), as "test/metric@k" -> (low, high).

    Example:
        >>> logged_intervals({"test.ndcg_at_10": 0.1, "test.ndcg_at_10.low": 0.09, "test.ndcg_at_10.high": 0.11})
        {'test/ndcg@10': (0.09, 0.11)}
    """
    out = {}
    for name, low in mlflow_metrics.items():
        if name.startswith("test.") and name.endswith(".low"):
            high = mlflow_metrics.get(name[: -len(".low")] + ".high")
            metric = name[len("test.") : -len(".low")].replace("_at_", "@")
            if high is not None:
                out[f"test/{metric}"] = (float(low), float(high))
    return out


def _trend(runs: list[Any], experiments: dict[str, str]) -> list[TrendPoint]:
    """Every finished evaluate run's `TREND_METRIC` on test with its interval, oldest first, and the gate's decision
    on the version its pipeline registered (the register run beside it)."""
    promoted = {
        run.data.tags[PARENT_TAG]: run.data.tags[PROMOTED_TAG] == "True"
        for run in runs
        if PROMOTED_TAG in run.data.tags and PARENT_TAG in run.data.tags
    }
    key = "test." + TREND_METRIC.replace("@", "_at_")
    names = {run.info.run_id: run.info.run_name for run in runs}  # a pipeline's run is named after its config
    points = []
    for run in runs:
        metrics = run.data.metrics
        if run.info.run_name != EVALUATE_RUN_NAME or run.info.status != "FINISHED" or key not in metrics:
            continue
        interval = logged_intervals(metrics).get(f"test/{TREND_METRIC}")
        points.append(TrendPoint(
            run_id=run.info.run_id, name=names.get(run.data.tags.get(PARENT_TAG, "")) or run.info.run_id,
            experiment=experiments.get(run.info.experiment_id, run.info.experiment_id),
            start_time=_from_millis(run.info.start_time) or datetime.min.replace(tzinfo=UTC), value=metrics[key],
            interval=interval, promoted=promoted.get(run.data.tags.get(PARENT_TAG, "")),
        ))  # fmt: skip
    return sorted(points, key=lambda point: point.start_time)


def _champion_comparison(runs: list[Any], trend: list[TrendPoint], uri: str, notes: list[str]) -> dict[str, Any] | None:
    """The newest evaluation against the champion's (the newest promoted one of the same experiment), user by user,
    from both evaluate runs' artifacts; None when either is missing."""
    champions = [point for point in trend if point.promoted]
    if not champions:
        return None
    champion = champions[-1]
    others = [p for p in trend if p.experiment == champion.experiment and p.run_id != champion.run_id]
    if not others:
        return None
    challenger = others[-1]
    from recsys.evaluation.uncertainty import Uncertainty

    try:
        with tempfile.TemporaryDirectory(prefix="recsys-dashboard-") as tmp:
            dirs = [_download_evaluation(p.run_id, Path(tmp) / p.run_id, uri) for p in (challenger, champion)]
            return compare_evaluation_dirs(dirs[0], dirs[1], Uncertainty())
    except Exception as err:  # evaluations that cannot be paired cost that section, not the page
        logger.warning("champion comparison of %s with %s: %s", challenger.run_id, champion.run_id, err)
        notes.append(f"the newest evaluation ({challenger.run_id[:8]}) and the champion's ({champion.run_id[:8]}) "
                     f"could not be compared: {err}")  # fmt: skip
        return None


def _download_evaluation(run_id: str, into: Path, uri: str) -> Path:
    import mlflow

    into.mkdir(parents=True)
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=EVALUATION_ARTIFACT_DIR, dst_path=str(into),
                                               tracking_uri=uri)  # fmt: skip
    return Path(path)


def _latest_evaluations(runs: list[Any], experiments: dict[str, str], uri: str, notes: list[str]) -> list[Evaluation]:
    """The newest finished `evaluate` run of each experiment (runs are newest first), with its report."""
    import mlflow

    latest: dict[str, Any] = {}
    for run in runs:
        if run.info.run_name == EVALUATE_RUN_NAME and run.info.status == "FINISHED":
            latest.setdefault(run.info.experiment_id, run)
    evaluations = []
    for experiment_id, run in latest.items():
        try:
            with tempfile.TemporaryDirectory(prefix="recsys-dashboard-") as tmp:
                path = mlflow.artifacts.download_artifacts(
                    run_id=run.info.run_id, artifact_path=EVALUATION_ARTIFACT, dst_path=tmp, tracking_uri=uri
                )
                report = read_json_object(Path(path), "evaluate the run again (`recsys pipeline run --rerun evaluate`)")
        except Exception as err:  # a missing or unreadable artifact costs that section, not the page
            logger.warning("evaluate run %s: %s unreadable: %s", run.info.run_id, EVALUATION_ARTIFACT, err)
            notes.append(f"evaluate run {run.info.run_id}: {EVALUATION_ARTIFACT} could not be read ({err})")
            continue
        evaluations.append(
            Evaluation(report, experiments[experiment_id], run.info.run_id, _from_millis(run.info.start_time))
        )
    return evaluations


def _from_millis(millis: int | None) -> datetime | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, tz=UTC)


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None
