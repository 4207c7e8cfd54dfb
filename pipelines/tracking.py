"""MLflow tracking helpers: one place that knows URIs, experiments and how params are flattened."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Run

logger = logging.getLogger(__name__)


def artifact_root(tracking_uri: str) -> str | None:
    """For a SQLite store, artifacts go to `mlartifacts/` beside the database file; else MLflow decides."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    db = Path(tracking_uri[len(prefix) :]).resolve()
    return (db.parent / "mlartifacts").as_uri()


@contextmanager
def mlflow_run(tracking_uri: str, experiment: str, run_name: str) -> Iterator[Run]:
    """Start a run in `experiment` (created if missing) on `tracking_uri`; it ends FAILED on error."""
    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=artifact_root(tracking_uri))
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name) as run:
        logger.info("MLflow run %s in experiment %r at %s", run.info.run_id, experiment, tracking_uri)
        yield run


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


def log_metrics(metrics: Mapping[str, float], prefix: str, step: int | None = None) -> None:
    """Log metrics under `<prefix><name>` with MLflow-safe names ('@' is not allowed)."""
    mlflow.log_metrics({f"{prefix}{k.replace('@', '_at_')}": float(v) for k, v in metrics.items()}, step=step)
