"""Experiment tracking: MLflow runs (the default), or an explicit offline mode that records nothing.

Which MLflow store is meant is the library's (`recsys.artifacts.registry.resolve_tracking_uri`); `start_tracking` is the
one place that knows experiments, how params are flattened and how metric names are made MLflow-safe; `store_lock`
serializes what must not run twice at once on a SQLite store (its creation and migration, creating an experiment, the
champion gate); `end_orphaned_runs` ends the runs a killed process left RUNNING. MLflow is imported only when a run
starts (it is slow to import and optional on machines that only train, e.g. a GPU box without it: `tracking.enabled:
false`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict
from torch import nn

from recsys.artifacts.registry import DEFAULT_WORK_DIR, PARENT_TAG, mlflow_module, resolve_tracking_uri, sqlite_path
from recsys.runtime.lock import exclusive_lock

logger = logging.getLogger(__name__)

STORE_LOCK_WAIT_S = 120.0  # how long a process waits for another to let go of a SQLite store (`store_lock`)

_UNSAFE_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")  # MLflow accepts these characters only


class TrackingSection(BaseModel):
    """An experiment config's `tracking` section: MLflow tracking; the URI falls back to $MLFLOW_TRACKING_URI, then
    the work dir's SQLite file `WORK/mlflow.db` (`under`: the pipeline names the store once it knows the work dir)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True  # false: no MLflow run (e.g. a GPU box without MLflow); the model dir is still written
    # e.g. postgresql+psycopg2://user@host:5432/db for a shared store (docs/pipelines.md); None: $MLFLOW_TRACKING_URI,
    # else sqlite:///WORK/mlflow.db
    uri: str | None = None
    experiment: str | None = None  # defaults to the config name
    # artifact location of experiments this creates; None: beside a SQLite file, else MLflow's default (./mlruns)
    artifacts: str | None = None

    def resolved_uri(self, work_dir: Path = DEFAULT_WORK_DIR) -> str:
        """The store meant for a run under `work_dir` (`recsys.artifacts.registry.resolve_tracking_uri`)."""
        return resolve_tracking_uri(self.uri, work_dir)

    def under(self, work_dir: Path) -> TrackingSection:
        """This section with its store named for a run under `work_dir`: `uri`, else $MLFLOW_TRACKING_URI, else
        `WORK/mlflow.db`; off, it is left as it is."""
        return self.model_copy(update={"uri": self.resolved_uri(work_dir)}) if self.enabled else self


class Tracker(Protocol):
    run_id: str | None

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], prefix: str = "", step: int | None = None) -> None: ...

    def log_artifacts(self, directory: Path, artifact_path: str) -> None: ...

    def log_model(self, model: nn.Module) -> None: ...


class MlflowTracker:
    """Logs into the active MLflow run."""

    def __init__(self, run_id: str) -> None:
        self.run_id: str | None = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        import mlflow

        mlflow.log_params(flatten(params))

    def log_metrics(self, metrics: Mapping[str, float], prefix: str = "", step: int | None = None) -> None:
        import mlflow

        mlflow.log_metrics({metric_name(f"{prefix}{k}"): float(v) for k, v in metrics.items()}, step=step)

    def log_artifacts(self, directory: Path, artifact_path: str) -> None:
        import mlflow

        mlflow.log_artifacts(str(directory), artifact_path=artifact_path)

    def log_model(self, model: nn.Module) -> None:
        """MLflow's pytorch flavour, pickled (torch.export cannot trace the models' slicing).

        MLflow warns about pickles on every call; the pickle is of our own classes, so that one is muted.
        """
        import mlflow

        mlflow_logger = logging.getLogger("mlflow.pytorch")
        level = mlflow_logger.level
        mlflow_logger.setLevel(logging.ERROR)
        try:
            mlflow.pytorch.log_model(model, name="model", serialization_format="pickle", pip_requirements=["torch"])
        finally:
            mlflow_logger.setLevel(level)


class OfflineTracker:
    """`tracking.enabled: false`: nothing is recorded (the model directory and metrics.json still are)."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], prefix: str = "", step: int | None = None) -> None:
        return None

    def log_artifacts(self, directory: Path, artifact_path: str) -> None:
        return None

    def log_model(self, model: nn.Module) -> None:
        return None


@contextmanager
def start_tracking(
    tracking: TrackingSection, experiment: str, run_name: str, tags: dict[str, str] | None = None
) -> Iterator[Tracker]:
    """A tracker for one run: an MLflow run in `experiment` (created if missing) with `tags`, ended FAILED on error."""
    if not tracking.enabled:
        logger.warning("MLflow tracking is off (tracking.enabled: false): this run is recorded in its model dir only")
        yield OfflineTracker()
        return
    mlflow = mlflow_module("MLflow tracking (`tracking.enabled: false` trains without it)", extra="pipelines")
    tracking_uri = resolve_tracking_uri(tracking.uri)
    mlflow.set_tracking_uri(tracking_uri)
    with store_lock(tracking_uri):  # the process's first use of the store: it may create it
        if mlflow.get_experiment_by_name(experiment) is None:
            mlflow.create_experiment(experiment, artifact_location=tracking.artifacts or artifact_root(tracking_uri))
        mlflow.set_experiment(experiment)
    # inside a pipeline's run, a step's run is nested under it
    with mlflow.start_run(run_name=run_name, nested=mlflow.active_run() is not None, tags=tags) as run:
        logger.debug("MLflow run %s in experiment %r at %s", run.info.run_id, experiment, tracking_uri)
        yield MlflowTracker(run.info.run_id)


@contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """For a SQLite store, hold its lock file (`DB.lock` beside the database) for the block, which reads and then
    writes the store (creating an experiment or a registered model, the champion gate): two processes doing that at
    once would both create, or both promote. It also serializes the store's creation: MLflow creates and migrates
    the database on a process's first use of it, and two processes doing that at once collide. Other stores: nothing
    is held."""
    db = sqlite_path(tracking_uri)
    if db is None:
        yield
        return
    what = f"the MLflow store {db} is locked"
    fix = "retry when that process is done, or end it if it hangs"
    with exclusive_lock(db.with_name(f"{db.name}.lock"), what=what, fix=fix, wait_s=STORE_LOCK_WAIT_S):
        yield


@dataclass(frozen=True)
class EndedRun:
    run_id: str
    name: str
    tags: dict[str, str]


def end_orphaned_runs(
    tracking: TrackingSection, experiment: str, orphaned: Callable[[Mapping[str, str]], bool]
) -> list[EndedRun]:
    """Mark KILLED the runs of `experiment` left RUNNING whose tags say they are `orphaned` (their process is gone),
    and the runs left RUNNING under them; returns them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolve_tracking_uri(tracking.uri))
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    running = client.search_runs([found.experiment_id], "attributes.status = 'RUNNING'")
    ended = {run.info.run_id: run for run in running if orphaned(run.data.tags)}
    while nested := [r for r in running if r.info.run_id not in ended and r.data.tags.get(PARENT_TAG) in ended]:
        ended |= {run.info.run_id: run for run in nested}
    for run_id in ended:
        client.set_terminated(run_id, "KILLED")
    return [EndedRun(run_id, run.info.run_name, run.data.tags) for run_id, run in ended.items()]


def artifact_root(tracking_uri: str) -> str | None:
    """For a SQLite store, artifacts go to `mlartifacts/` beside the database file; else MLflow decides."""
    db = sqlite_path(tracking_uri)
    return None if db is None else (db.parent / "mlartifacts").as_uri()


def metric_name(name: str) -> str:
    """An MLflow-safe metric name: '@' -> '_at_', '+' -> 'plus', any other character MLflow refuses -> '_'.

    Example:
        >>> metric_name("slice.history_length_21+.ndcg@10"), metric_name("slice.domain_toys & games.users")
        ('slice.history_length_21plus.ndcg_at_10', 'slice.domain_toys _ games.users')
    """
    return _UNSAFE_METRIC_CHARS.sub("_", name.replace("@", "_at_").replace("+", "plus"))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1e-3}} -> {"train.lr": 1e-3}, for mlflow.log_params.

    Example:
        >>> flatten({"a": {"b": 1, "c": [1, 2]}, "d": None})
        {'a.b': 1, 'a.c': '[1, 2]', 'd': 'None'}
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, int | float | str) and not isinstance(value, bool) else str(value)
    return out
