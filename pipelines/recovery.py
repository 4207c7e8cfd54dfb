"""What lets a pipeline run resume after a crash and clean up after a killed one.

    state.json    `WORK/pipelines/NAME/state.json`: (fingerprint, outputs) of every step that ran, rewritten
                  atomically after each, so a re-run skips what is up to date and resumes at the step that failed
    lock          `WORK/pipelines/NAME/lock`: one process runs a pipeline under a work dir at a time (an OS lock,
                  gone with its process, kill -9 included)

Holding the lock, a run first clears what killed runs left: the temporaries of their atomic writes, and their MLflow
runs still RUNNING (marked KILLED; the pipeline's run is tagged with the work dir, the pipeline and the lock's holder
to tell them apart).
"""

from __future__ import annotations

import glob
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from pipelines.config import ExperimentConfig
from pipelines.distill import teacher_cache_path
from pipelines.steps.base import ExperimentPaths, Step
from pipelines.steps.outputs import Output
from pipelines.tracking import end_orphaned_runs
from pipelines.train import compile_cache_file, training_state_path
from recsys.artifacts.registry import PARENT_TAG
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_file, remove_temporaries
from recsys.runtime.json_files import read_json_object
from recsys.runtime.lock import HeldLock

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
LOCK_FILE = "lock"
# the pipeline run's tags: whose run it is and which holder of the lock ran it
WORK_DIR_TAG, PIPELINE_TAG = "recsys.work_dir", "recsys.pipeline"
HOST_TAG, PID_TAG, LOCK_TOKEN_TAG = "recsys.host", "recsys.pid", "recsys.lock_token"

State = dict[str, dict[str, Any]]  # {step name: {"fingerprint", "outputs"}}


def read_state(paths: ExperimentPaths) -> State:
    """What earlier runs recorded per step; {} (every step runs, and the file is rewritten after the first) when
    there is none or it does not read (cut short, not JSON, another shape): a state file never blocks a run."""
    state_path = paths.pipeline_dir / STATE_FILE
    if not state_path.exists():
        return {}
    try:
        state = read_json_object(state_path, "none needed")
    except DataError as err:  # a disk that filled up under it, a hand edit: the steps' outputs are checked anew
        logger.warning("%s: %s: every step runs again and the file is rewritten", err.path,
                       err.problem)  # fmt: skip
        return {}
    return {name: record for name, record in state.items() if isinstance(record, dict)}


def write_state(paths: ExperimentPaths, state: State) -> None:
    with atomic_file(paths.pipeline_dir / STATE_FILE) as tmp:
        tmp.write_text(json.dumps(state, indent=2) + "\n")


def previous_outputs(step: Step[Any], recorded: dict[str, Any] | None, fingerprint: str) -> Output | None:
    """The outputs a previous run recorded for the same inputs, when they still exist; None otherwise."""
    if recorded is None or recorded.get("fingerprint") != fingerprint or "outputs" not in recorded:
        return None
    try:
        outputs: Output = TypeAdapter(step.output).validate_python(recorded["outputs"])
    except ValidationError:  # recorded by an earlier version of the runner
        return None
    return outputs if all(p.exists() for p in step.produces(outputs)) else None


def remove_left_temporaries(paths: ExperimentPaths) -> None:
    """Remove what killed runs of this pipeline left of their atomic writes (`recsys.runtime.atomic`): beside and in
    its output directories, its training states, caches and its state file. Only under the pipeline's lock: no one else
    writes them."""
    removed = remove_temporaries(paths.pipeline_dir)
    for out_dir in paths.outputs():
        removed += remove_temporaries(out_dir.parent, glob.escape(out_dir.name)) + remove_temporaries(out_dir)
    state = training_state_path(paths.model_dir)  # and the per-domain ones, NAME.training-state.DOMAIN.dcp
    removed += remove_temporaries(state.parent, f"{glob.escape(state.stem)}*{state.suffix}")
    for cache in (teacher_cache_path(paths.model_dir), compile_cache_file(paths.model_dir)):
        removed += remove_temporaries(cache.parent, glob.escape(cache.name))
    if removed:
        logger.warning("removed what interrupted runs left: %s", ", ".join(map(str, removed)))


def run_tags(work_dir: Path, config: ExperimentConfig, lock: HeldLock) -> dict[str, str]:
    """The pipeline run's tags: whose run it is (this pipeline under this work dir) and which holder of its lock ran
    it, so a later run can tell a run left RUNNING by a killed process from a live one."""
    holder = lock.holder
    return {WORK_DIR_TAG: str(work_dir.resolve()), PIPELINE_TAG: config.name, HOST_TAG: holder.host,
            PID_TAG: str(holder.pid), LOCK_TOKEN_TAG: holder.token}  # fmt: skip


def end_runs_of_killed_attempts(config: ExperimentConfig, work_dir: Path, lock: HeldLock) -> None:
    """Mark KILLED the MLflow runs that killed runs of this pipeline under `work_dir` left RUNNING (and their step
    runs): those whose lock this process now holds. Runs of other work dirs, pipelines or live hosts are left alone."""
    owner = {WORK_DIR_TAG: str(work_dir.resolve()), PIPELINE_TAG: config.name}

    def orphaned(tags: Mapping[str, str]) -> bool:
        mine = all(tags.get(key) == value for key, value in owner.items())
        return mine and lock.outlived(tags.get(HOST_TAG, ""), tags.get(LOCK_TOKEN_TAG, ""))

    for run in end_orphaned_runs(config.tracking, config.experiment_name, orphaned):
        parent = run.tags.get(PARENT_TAG)
        by = f"pid {run.tags.get(PID_TAG)} on {run.tags.get(HOST_TAG)}" if parent is None else f"a step of run {parent}"
        logger.warning("MLflow run %s (%s, %s) was left RUNNING by a killed process: marked KILLED", run.run_id,
                       run.name, by)  # fmt: skip
