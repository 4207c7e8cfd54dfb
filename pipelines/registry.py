"""Model bundles (`pipelines.bundle`) in the MLflow model registry, and the champion gate.

`register_bundle` logs a bundle as the artifacts of an MLflow run, creates a new version of the registered model,
and moves the alias `champion` to it only when its validation NDCG@10 is not worse than the current champion's by
more than `tolerance`; the decision and both numbers are logged and kept as tags of the new version.
`resolve_bundle` finds the bundle to serve: a directory, or a registered model's champion.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.bundle import Bundle, BundleError

logger = logging.getLogger(__name__)

CHAMPION = "champion"
GATE_METRIC = "valid_ndcg_at_10"


@dataclass(frozen=True)
class GateDecision:
    """Whether version `version` of `model_name` became the champion, and why."""

    model_name: str
    version: str
    promoted: bool
    value: float  # the new version's validation NDCG@10
    champion_version: str | None  # the champion it was compared with (None: there was none)
    champion_value: float | None
    tolerance: float
    reason: str


def register_bundle(bundle: Bundle, model_name: str, tracking_uri: str, tolerance: float = 0.0) -> GateDecision:
    """Log the bundle to MLflow, register it as a new version of `model_name`, and apply the champion gate.

    Runs inside the active MLflow run when there is one (as a nested run), else in a run of its own.
    """
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    value = bundle.validation_ndcg_at_10
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    with mlflow.start_run(run_name=f"register {model_name}", nested=mlflow.active_run() is not None) as run:
        mlflow.log_artifacts(str(bundle.path), artifact_path="bundle")
        mlflow.log_metric(GATE_METRIC, value)
        try:
            client.get_registered_model(model_name)
        except MlflowException:
            client.create_registered_model(model_name, description="recsys model bundles (pipelines/registry.py)")
        version = client.create_model_version(
            model_name, source=f"{run.info.artifact_uri}/bundle", run_id=run.info.run_id, tags={GATE_METRIC: str(value)}
        ).version
        champion = _champion(client, model_name)
        decision = _decide(model_name, str(version), value, champion, tolerance)
        if decision.promoted:
            client.set_registered_model_alias(model_name, CHAMPION, str(version))
        for key, tag in asdict(decision).items():
            client.set_model_version_tag(model_name, str(version), f"gate.{key}", str(tag))
        mlflow.log_dict(asdict(decision), "gate_decision.json")
    logger.info("champion gate for %s v%s: %s", model_name, version, decision.reason)
    return decision


@dataclass(frozen=True)
class Champion:
    """The version holding the `champion` alias and where its bundle lives (an artifact URI)."""

    version: str
    source: str


def get_champion(model_name: str, tracking_uri: str) -> Champion | None:
    """The current champion of `model_name` (one registry lookup), or None when there is none."""
    from mlflow.tracking import MlflowClient

    found = _champion(MlflowClient(tracking_uri), model_name)
    return None if found is None else Champion(str(found.version), str(found.source))


def download_bundle(source: str, tracking_uri: str) -> Bundle:
    """A local copy of a registered bundle (MLflow caches the download)."""
    import mlflow

    return Bundle(Path(mlflow.artifacts.download_artifacts(artifact_uri=source, tracking_uri=tracking_uri)))


def download_champion_bundle(model_name: str, tracking_uri: str) -> Bundle | None:
    """A local copy of the champion's bundle, or None without a champion."""
    current = get_champion(model_name, tracking_uri)
    return None if current is None else download_bundle(current.source, tracking_uri)


def resolve_bundle(bundle: Path | None, model_name: str | None, tracking_uri: str) -> Bundle:
    """The bundle to serve: the directory `bundle`, or the registered model's champion (downloaded)."""
    if bundle is not None:
        return Bundle(bundle)
    if model_name is None:
        raise BundleError(
            "nothing to serve. Fix: set RECSYS_BUNDLE to a bundle directory or RECSYS_MODEL_NAME to a registered model"
        )
    champion = download_champion_bundle(model_name, tracking_uri)
    if champion is None:
        raise BundleError(
            f"registered model {model_name!r} has no champion in {tracking_uri}. Fix: run `recsys pipeline run`"
        )
    return champion


def _champion(client: Any, model_name: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:  # no such model or no champion yet
        return None


def _decide(model_name: str, version: str, value: float, champion: Any | None, tolerance: float) -> GateDecision:
    if champion is None:
        return GateDecision(model_name, version, True, value, None, None, tolerance, "first version: champion")
    champion_value = float(champion.tags[GATE_METRIC])
    promoted = value >= champion_value - tolerance
    verdict = "promoted" if promoted else "kept the champion"
    reason = (
        f"{verdict}: validation NDCG@10 {value:.4f} vs champion v{champion.version} {champion_value:.4f} "
        f"(tolerance {tolerance:g})"
    )
    return GateDecision(model_name, version, promoted, value, str(champion.version), champion_value, tolerance, reason)
