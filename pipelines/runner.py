"""The one orchestrator of the platform's steps (`pipelines.steps.STEPS`, in order), behind `recsys pipeline run` and
the Airflow DAGs; `recsys train`, `recsys sid build` and the benchmarks are this runner stopped after a step (`until`).
It knows a step by its interface alone (`pipelines.steps.base.Step`), never by its name.

The runner fingerprints every step's inputs (its config sections and its upstream steps' outputs) and records
(fingerprint, outputs) in the pipeline's state file (`pipelines.recovery`), so a re-run skips every step whose inputs
did not change and whose outputs still exist, and a run that crashed resumes at the step that failed. A step that does
not apply to the config (no inputs) is recorded as such. With tracking on, the pipeline is one MLflow run and each
step that runs is a nested run of it (params = its inputs, metrics = its numeric outputs; a step that opens its own
run logs its own). One process at a time runs a pipeline under a work dir (its lock, `pipelines.recovery`); a second
one fails at once naming the holder, or waits (`wait_s`).

On several processes (`torchrun`), the first runs the pipeline. The others wait for it at each step before a step that
every process runs (`Step.every_process`: training) and read that step's outputs from the state file, run that one
beside it, and stop after the last such step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.recovery import (
    LOCK_FILE,
    State,
    end_runs_of_killed_attempts,
    previous_outputs,
    read_state,
    remove_left_temporaries,
    run_tags,
    write_state,
)
from pipelines.steps import STEP_NAMES, STEPS, check_step_names
from pipelines.steps.base import ExperimentPaths, Step, as_json, fingerprint
from pipelines.steps.outputs import Output, PipelineOutputs
from pipelines.tracking import OfflineTracker, Tracker, start_tracking
from recsys.errors import RecsysError
from recsys.runtime.device import resolve_device
from recsys.runtime.distributed import Workers, join, wait_for_everyone
from recsys.runtime.lock import exclusive_lock

logger = logging.getLogger(__name__)

Steps = Sequence[Step[Any]]


@dataclass(frozen=True)
class StepReport:
    name: str
    status: str  # "ran", "skipped" (up to date), "given" (by the caller: `Step.given`) or "not applicable"
    seconds: float
    outputs: Output | None


def run_pipeline(
    config: ExperimentConfig,
    work_dir: Path,
    *,
    only: str | None = None,
    until: str | None = None,
    data_dir: Path | None = None,
    rerun: Collection[str] = (),
    wait_s: float = 0.0,
) -> tuple[PipelineOutputs, list[StepReport]]:
    """Run the pipeline of `config` under `work_dir`, skipping up-to-date steps; returns the outputs and one report
    per step.

    Args:
        only: run just this step (an Airflow task): the steps before it must be up to date (else `RecsysError` says
            which one to run), the steps after it are left alone.
        until: stop after this step.
        data_dir: an already prepared directory to use instead of preparing `config.data` (it stands in for the
            outputs of the step that takes it: `Step.given`).
        rerun: steps to run from scratch even when they are up to date: what a step keeps to resume or skip work (a
            training state, built semantic IDs) is dropped first, e.g. for a benchmark that times a whole training run.
        wait_s: when another process runs this pipeline under `work_dir`, wait this long for it to finish; 0: raise
            `LockHeldError` (a `RecsysError` naming its pid and host) at once.
    """
    if only and until:
        raise RecsysError(f"run only {only!r} or until {until!r}, not both. Fix: drop one of them")
    last = only or until
    check_step_names(last, *rerun)
    config = config.model_copy(update={"tracking": config.tracking.under(work_dir)})  # the store: WORK's by default
    paths = ExperimentPaths.under(work_dir, config)
    steps = STEPS[: STEP_NAMES.index(last) + 1] if last else STEPS
    check_run(config, only=only, until=until)
    workers = join(resolve_device(config.train.hardware.device))
    if not workers.is_main:
        return _follow(steps, config, paths, data_dir, rerun)
    what = f"pipeline {config.name} under {work_dir} is being run"
    fix = "wait for it to finish (`--wait SECONDS` queues behind it), or use another --work-dir"
    with exclusive_lock(paths.pipeline_dir / LOCK_FILE, what=what, fix=fix, wait_s=wait_s) as lock:
        remove_left_temporaries(paths)
        tags = run_tags(work_dir, config, lock)
        run_name = f"pipeline {config.name}" + (f": {only}" if only else f" until {until}" if until else "")
        with start_tracking(config.tracking, config.experiment_name, run_name, tags) as tracker:
            if tracker.run_id is not None:
                end_runs_of_killed_attempts(config, work_dir, lock)
            done, reports = _run_steps(steps, config, paths, tracker, only, data_dir, rerun)
    return done, reports


def check_run(config: ExperimentConfig, *, only: str | None = None, until: str | None = None) -> None:
    """RecsysError naming what a run with these `only` / `until` options needs that is not there and no step of it
    makes (`Step.check`: a trained model the config's model is built on), before anything is written: such a run
    would otherwise prepare the data for minutes, then fail at its train step."""
    for step in STEPS:
        if runs_step(step.name, only, until):
            step.check(config)


def runs_step(name: str, only: str | None, until: str | None) -> bool:
    """Whether a run with these `only` / `until` options runs (or skips) step `name`."""
    if only is not None:
        return only == name
    return until is None or STEP_NAMES.index(name) <= STEP_NAMES.index(until)


def _run_steps(
    steps: Steps,
    config: ExperimentConfig,
    paths: ExperimentPaths,
    tracker: Tracker,
    only: str | None,
    data_dir: Path | None,
    rerun: Collection[str],
) -> tuple[PipelineOutputs, list[StepReport]]:
    """Run (or skip) `steps` in order, recording each one that ran in the state file."""
    state = read_state(paths)
    done, reports = PipelineOutputs(), []
    followed = _followed_by_others(steps)
    for step in steps:
        report = _given(step, data_dir)
        if report is None:
            report = _run_step(step, config, paths, done, state, tracker, only, rerun)
            if report.status == "ran":
                write_state(paths, state)
        setattr(done, step.field, report.outputs)
        reports.append(report)
        if step in followed and not step.every_process:
            wait_for_everyone()  # the other processes of a distributed run wait for this step (`_follow`)
    tracker.log_params({f"step.{r.name}": r.status for r in reports})
    return done, reports


def _follow(
    steps: Steps, config: ExperimentConfig, paths: ExperimentPaths, data_dir: Path | None, rerun: Collection[str]
) -> tuple[PipelineOutputs, list[StepReport]]:
    """What a process other than the first of a distributed run does: it waits for the first to run (or skip) each
    step before one that every process runs, reads their outputs, and runs that one beside it. The lock, the state
    file, MLflow and every write are the first process's; the steps after the last one every process runs are too."""
    done, reports = PipelineOutputs(), []
    for step in _followed_by_others(steps):
        if step.every_process:  # what a process writes, only the first writes
            report = _run_step(step, config, paths, done, read_state(paths), OfflineTracker(), None, rerun)
        else:
            wait_for_everyone()  # the first process has run or skipped the step
            report = _followed_step(step, config, paths, done, data_dir)
        setattr(done, step.field, report.outputs)
        reports.append(report)
    return done, reports


def _followed_by_others(steps: Steps) -> Steps:
    """The steps the other processes of a distributed run go through: up to the last one every process runs (none
    when no step of `steps` is one)."""
    ends = [i + 1 for i, step in enumerate(steps) if step.every_process]
    return steps[: ends[-1]] if ends else ()


def _followed_step(
    step: Step[Any], config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs, data_dir: Path | None
) -> StepReport:
    """A step the first process ran or skipped: its outputs, as the state file records them."""
    given = _given(step, data_dir)
    if given is not None:
        return given
    inputs = step.inputs(config, done)
    if inputs is None:
        return StepReport(step.name, "not applicable", 0.0, None)
    outputs = previous_outputs(step, read_state(paths).get(step.name), fingerprint(inputs))
    if outputs is None:
        raise RecsysError(
            f"step {step.name} of {config.name} is not done after the first process ran it. Fix: see the first "
            "process's log for its error"
        )
    return StepReport(step.name, "skipped", 0.0, outputs)


def _given(step: Step[Any], data_dir: Path | None) -> StepReport | None:
    """The step's outputs as the caller gives them (`data_dir`, when it stands in for them: `Step.given`), else None."""
    outputs = None if data_dir is None else step.given(data_dir)
    return None if outputs is None else StepReport(step.name, "given", 0.0, outputs)


def _run_step(
    step: Step[Any],
    config: ExperimentConfig,
    paths: ExperimentPaths,
    done: PipelineOutputs,
    state: State,
    tracker: Tracker,
    only: str | None,
    rerun: Collection[str],
) -> StepReport:
    """Skip the step when it is up to date, else run it (inside a nested MLflow run) and record it in `state`."""
    inputs = step.inputs(config, done)
    if inputs is None:
        return StepReport(step.name, "not applicable", 0.0, None)
    key = fingerprint(inputs)
    previous = previous_outputs(step, state.get(step.name), key)
    if previous is not None and step.name not in rerun:
        logger.info("step %s: up to date, skipped", step.name)
        return StepReport(step.name, "skipped", 0.0, previous)
    if only is not None and step.name != only:
        raise RecsysError(
            f"step {step.name} is not up to date for {config.name}. Fix: run it first "
            f"(`recsys pipeline run --config ... --step {step.name}`, or its Airflow task)"
        )
    if step.name in rerun and Workers.from_environment().is_main:
        step.fresh_start(paths)
    if step.every_process:
        wait_for_everyone()  # every process of a distributed run then reads the same state to resume from (or none)
    start = time.perf_counter()
    logger.info("step %s: running", step.name)
    if step.opens_own_run or tracker.run_id is None:
        outputs = step.run(config, paths, done)
    else:
        with start_tracking(config.tracking, config.experiment_name, step.name) as step_tracker:
            step_tracker.log_params(inputs)
            outputs = step.run(config, paths, done)
            step_tracker.log_metrics(_numbers(outputs.summary()))
    state[step.name] = {"fingerprint": key, "outputs": as_json(outputs)}
    return StepReport(step.name, "ran", time.perf_counter() - start, outputs)


def _numbers(summary: dict[str, object]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
