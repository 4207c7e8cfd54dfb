"""What the Airflow DAGs in dags/ call: one pipeline step per task, and the champion's index refresh.

The DAG files only wire these into tasks; everything they do lives here and in the steps, so a task
behaves exactly like `recsys pipeline run --step NAME` (same skips, same errors).

Task params (DAG-level `params`, overridable per run): `config` (an experiment YAML), `work_dir`, for the train
step `nproc_per_node` (None: the config's `train.nproc_per_node`), and for the refresh `index_dir`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.config import load_config
from pipelines.index import build_index_step
from pipelines.launcher import launch, needs_launch
from pipelines.runner import run_pipeline
from pipelines.steps import TRAIN_STEP
from recsys.artifacts.registry import download_champion_bundle
from recsys.errors import RecsysError

logger = logging.getLogger(__name__)


def run_step_task(step: str, params: Mapping[str, Any]) -> dict[str, str]:
    """Run pipeline step `step` of `params["config"]` under `params["work_dir"]`; returns each step's status.

    With `params["nproc_per_node"]` N > 1 (None: the config's `train.nproc_per_node`), the train step is `recsys
    pipeline run --step train_retriever --nproc-per-node N`: N processes of this host train, then this task finds the
    step up to date.
    """
    config, work_dir = load_config(Path(params["config"])), Path(params["work_dir"])
    nproc: int = params.get("nproc_per_node") or config.train.distributed.nproc_per_node
    if step == TRAIN_STEP and needs_launch(nproc):
        experiment = ["--config", str(params["config"]), "--work-dir", str(work_dir)]
        launch(nproc, ["pipeline", "run", *experiment, "--step", step])
    _, reports = run_pipeline(config, work_dir, only=step)
    return {r.name: r.status for r in reports}


def refresh_champion_index_task(params: Mapping[str, Any]) -> str:
    """Rebuild (or keep, when up to date) the FAISS index of the registered champion's item vectors."""
    config, work_dir = load_config(Path(params["config"])), Path(params["work_dir"])
    bundle = download_champion_bundle(config.registered_model_name, config.tracking.resolved_uri(work_dir))
    if bundle is None:
        raise RecsysError(f"{config.registered_model_name} has no champion yet. Fix: let daily_training run first")
    index_dir = Path(params.get("index_dir") or work_dir / "indexes" / f"{config.name}-champion")
    return str(build_index_step(bundle.model_dir, index_dir, config.pipeline.index))
