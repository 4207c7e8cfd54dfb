"""The model registry, read side: which MLflow store is meant, the registered model's `champion` and a local copy of
its bundle; the names of the tags the registry and the pipeline's runs carry.

The pipelines write the registry (`pipelines.registry`: a bundle logged, a version created, the champion gate); serving
and the dashboard read it through this module alone. MLflow is imported on use: a server of a bundle directory needs
none (`MissingExtra` names the extra when a registry is asked for without it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from recsys.artifacts.bundle import Bundle, BundleError
from recsys.runtime.extras import optional

DEFAULT_WORK_DIR = Path("runs")  # the --work-dir of the commands that train, and so where `recsys serve` looks
STORE_FILE = "mlflow.db"  # the default MLflow store: this SQLite file in the work dir, its artifacts in mlartifacts/
SQLITE_PREFIX = "sqlite:///"
CHAMPION = "champion"  # the alias of the version that serves
GATE_METRIC = "valid_ndcg_at_10"  # a version's tag: its validation NDCG@10, the champion gate's metric
PROMOTED_TAG = "gate.promoted"  # the gate's decision, on its register run (the dashboard's trend reads it)
PARENT_TAG = "mlflow.parentRunId"  # MLflow's tag on a nested run: a pipeline's steps are nested runs of its run


def resolve_tracking_uri(uri: str | None, work_dir: Path = DEFAULT_WORK_DIR) -> str:
    """The MLflow store meant: `uri` when given, else $MLFLOW_TRACKING_URI, else the work dir's own store
    (`default_tracking_uri`; `runs`, the commands' default work dir, for a command that has none, e.g. serving)."""
    return configured_tracking_uri(uri) or default_tracking_uri(work_dir)


def default_tracking_uri(work_dir: Path) -> str:
    """The store of a work dir nobody named another for: `WORK/mlflow.db` (absolute), artifacts in `WORK/mlartifacts`
    (`pipelines.tracking.artifact_root`), so a command writes nothing into the directory it is started from.

    Example:
        >>> default_tracking_uri(Path("/srv/runs"))
        'sqlite:////srv/runs/mlflow.db'
    """
    return f"{SQLITE_PREFIX}{(work_dir / STORE_FILE).resolve()}"


def configured_tracking_uri(uri: str | None) -> str | None:
    """The MLflow store someone named (`uri`, else $MLFLOW_TRACKING_URI), or None."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a SQLite store's URI (absolute); None for other stores.

    Example:
        >>> sqlite_path("postgresql://db/mlflow") is None, sqlite_path("sqlite:////srv/mlflow.db").name
        (True, 'mlflow.db')
    """
    return Path(tracking_uri[len(SQLITE_PREFIX) :]).resolve() if tracking_uri.startswith(SQLITE_PREFIX) else None


def mlflow_module(feature: str = "the MLflow model registry", extra: str = "registry") -> ModuleType:
    """`mlflow`, or a `MissingExtra` naming `extra`."""
    return optional("mlflow", extra=extra, feature=feature)


@dataclass(frozen=True)
class Champion:
    """The version holding the `champion` alias and where its bundle lives (an artifact URI)."""

    version: str
    source: str


def champion_record(client: Any, model_name: str) -> Any | None:
    """The registry's record of `model_name`'s champion (an MLflow `ModelVersion`), or None: no such model, or no
    champion yet."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:
        return None


def get_champion(model_name: str, tracking_uri: str) -> Champion | None:
    """The current champion of `model_name` (one registry lookup), or None when there is none."""
    mlflow = mlflow_module()
    found = champion_record(mlflow.tracking.MlflowClient(tracking_uri), model_name)
    return None if found is None else Champion(str(found.version), str(found.source))


def download_bundle(source: str, tracking_uri: str) -> Bundle:
    """A local copy of a registered bundle (MLflow caches the download)."""
    mlflow = mlflow_module()
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
