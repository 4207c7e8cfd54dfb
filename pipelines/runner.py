"""The one orchestrator of the platform's steps: prepare_data -> embed_content -> build_semantic_ids ->
train_retriever -> build_index -> evaluate -> register (`recsys pipeline run`, the Airflow DAGs). `recsys train`,
`recsys sid build` and the benchmarks are this runner stopped after a step (`until`).

Each step is a function `(config, inputs) -> outputs` (a frozen dataclass) whose work is written atomically. The
runner fingerprints every step's inputs (its config sections and its upstream steps' outputs) and records
(fingerprint, outputs) in `WORK/pipelines/NAME/state.json` (rewritten atomically after each step), so a
re-run skips every step whose inputs did not change and whose outputs still exist, and a run that crashed
resumes at the step that failed. With tracking on, the pipeline is one MLflow run and each step that runs
is a nested run of it (params = its inputs, metrics = its numeric outputs).

One process at a time runs a pipeline under a work dir: it holds `WORK/pipelines/NAME/lock` (an OS lock, gone with
the process, kill -9 included); a second one fails at once naming the holder, or waits (`wait_s`). Holding it, a
run first clears what killed runs left: the temporaries of their atomic writes, and their MLflow runs still RUNNING
(marked KILLED; the pipeline run is tagged with the work dir, the pipeline and the lock's holder to tell them apart).

Steps that do not apply are recorded as such: no `sid` section -> no content embeddings and no semantic IDs;
a model without item vectors (generative, popularity, ranker) -> no index; tracking off -> no registration.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from pipelines.bundle import BUNDLE_FILE, Bundle
from pipelines.config import ExperimentConfig
from pipelines.content import embed_content_step, embed_training_queries
from pipelines.dashboard import EVALUATION_FILE
from pipelines.data import data_fingerprint, prepare_step
from pipelines.distill import TEACHER_KEY, teacher_cache_path
from pipelines.evaluate import EvaluateOutputs, evaluate_step
from pipelines.model_dir import MODEL_FILE, file_sha256, model_sha256
from pipelines.registry import GateDecision, GateRule, register_bundle
from pipelines.semantic_ids import SEMANTIC_IDS_FILE, build_semantic_ids_step
from pipelines.tracking import PARENT_TAG, OfflineTracker, Tracker, end_orphaned_runs, start_tracking
from pipelines.train import CatalogFeatures, TrainOutputs, train_step, training_state_path
from recsys.data.schema import META_FILE
from recsys.errors import RecsysError
from recsys.retrieval.config import INDEX_FILE
from recsys.runtime.atomic import atomic_file, remove_temporaries
from recsys.runtime.device import resolve_device
from recsys.runtime.digest import feed_file
from recsys.runtime.distributed import Workers, join, wait_for_everyone
from recsys.runtime.lock import HeldLock, exclusive_lock
from recsys.training.recipes import QueryAwareTraining

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
TRAIN_STEP = "train_retriever"  # the step every process of a distributed run takes part in
LOCK_FILE = "lock"  # WORK/pipelines/NAME/lock: one process runs a pipeline under a work dir at a time
# the pipeline run's tags: whose run it is and which holder of the lock ran it
WORK_DIR_TAG, PIPELINE_TAG = "recsys.work_dir", "recsys.pipeline"
HOST_TAG, PID_TAG, LOCK_TOKEN_TAG = "recsys.host", "recsys.pid", "recsys.lock_token"


@dataclass(frozen=True)
class ExperimentPaths:
    """Where an experiment keeps its prepared data, semantic IDs, model, index, evaluation, bundle and cache."""

    data_dir: Path
    content_dir: Path
    sid_dir: Path
    model_dir: Path
    cache_dir: Path
    index_dir: Path
    bundle_dir: Path
    evaluation_dir: Path  # evaluation.json (slices) and dashboard.html of the `evaluate` step
    pipeline_dir: Path  # the runner's: state.json and the lock

    @staticmethod
    def under(work_dir: Path, config: ExperimentConfig) -> ExperimentPaths:
        return ExperimentPaths(
            data_dir=work_dir / "data" / config.name,
            content_dir=work_dir / "content" / config.name,
            sid_dir=work_dir / "sids" / config.name,
            model_dir=work_dir / "models" / config.name,
            cache_dir=work_dir / "cache" / "embeddings",
            index_dir=work_dir / "indexes" / config.name,
            bundle_dir=work_dir / "bundles" / config.name,
            evaluation_dir=work_dir / "evaluations" / config.name,
            pipeline_dir=work_dir / "pipelines" / config.name,
        )

    def outputs(self) -> list[Path]:
        """The steps' output directories: this experiment's alone (the embeddings cache is shared, so not one)."""
        return [self.data_dir, self.content_dir, self.sid_dir, self.model_dir, self.index_dir, self.bundle_dir,
                self.evaluation_dir]  # fmt: skip


# ------------------------------------------------------------------------------------------- the steps' outputs


@dataclass(frozen=True)
class PreparedData:
    data_dir: Path
    sha256: str  # of its files: what the steps downstream of the data depend on

    def summary(self) -> dict[str, object]:
        return {"data_dir": self.data_dir}


@dataclass(frozen=True)
class ContentEmbeddings:
    path: Path  # content_embeddings.npy
    queries: Path | None = None  # training_queries.npz, for a query-aware model
    encoder: str | None = None  # the encoder (`ContentConfig.model`) that made them

    def summary(self) -> dict[str, object]:
        return {"content_embeddings": self.path, "training_queries": self.queries}


@dataclass(frozen=True)
class SemanticIds:
    path: Path  # semantic_ids.parquet

    def summary(self) -> dict[str, object]:
        return {"semantic_ids": self.path}


@dataclass(frozen=True)
class IndexOutputs:
    index_dir: Path
    recall: float  # recall@k of the index against exact search, measured as it was built
    k: int

    def summary(self) -> dict[str, object]:
        return {"index_dir": self.index_dir, "recall@k": self.recall, "k": self.k}


@dataclass(frozen=True)
class Registration:
    bundle_dir: Path
    decision: GateDecision

    def summary(self) -> dict[str, object]:
        d = self.decision
        return {"bundle_dir": self.bundle_dir, "version": d.version, "promoted": d.promoted, "reason": d.reason}


Output = PreparedData | ContentEmbeddings | SemanticIds | TrainOutputs | IndexOutputs | EvaluateOutputs | Registration


@dataclass
class PipelineOutputs:
    """What the steps have produced so far (None: not run yet, or not applicable)."""

    data: PreparedData | None = None
    content: ContentEmbeddings | None = None
    semantic_ids: SemanticIds | None = None
    model: TrainOutputs | None = None
    index: IndexOutputs | None = None
    evaluation: EvaluateOutputs | None = None
    registration: Registration | None = None

    def features(self) -> CatalogFeatures:
        return CatalogFeatures(
            semantic_ids=None if self.semantic_ids is None else self.semantic_ids.path,
            content_embeddings=None if self.content is None else self.content.path,
            content_encoder=None if self.content is None else self.content.encoder,
            training_queries=None if self.content is None else self.content.queries,
        )


@dataclass(frozen=True)
class StepReport:
    name: str
    status: str  # "ran", "skipped" (up to date), "given" (the caller's prepared data) or "not applicable"
    seconds: float
    outputs: Output | None


# ------------------------------------------------------------------------------------------------ the runner


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
        data_dir: an already prepared directory to use instead of preparing `config.data`.
        rerun: steps to run from scratch even when they are up to date: what a step keeps to resume or skip work (a
            training state, built semantic IDs) is dropped first, e.g. for a benchmark that times a whole training run.
        wait_s: when another process runs this pipeline under `work_dir`, wait this long for it to finish; 0: raise
            `LockHeldError` (a `RecsysError` naming its pid and host) at once.
    """
    if only and until:
        raise RecsysError(f"run only {only!r} or until {until!r}, not both. Fix: drop one of them")
    last = only or until
    for name in (last, *rerun):
        if name is not None and name not in STEP_NAMES:
            raise RecsysError(f"unknown pipeline step {name!r}. Fix: one of {', '.join(STEP_NAMES)}")
    paths = ExperimentPaths.under(work_dir, config)
    steps = STEPS[: STEP_NAMES.index(last) + 1] if last else STEPS
    workers = join(resolve_device(config.train.device))
    if not workers.is_main:
        return _follow(steps, config, paths, data_dir, rerun)
    what = f"pipeline {config.name} under {work_dir} is being run"
    fix = "wait for it to finish (`--wait SECONDS` queues behind it), or use another --work-dir"
    with exclusive_lock(paths.pipeline_dir / LOCK_FILE, what=what, fix=fix, wait_s=wait_s) as lock:
        _remove_temporaries(paths)
        tags = _run_tags(work_dir, config, lock)
        run_name = f"pipeline {config.name}" + (f": {only}" if only else f" until {until}" if until else "")
        with start_tracking(config.tracking, config.experiment_name, run_name, tags) as tracker:
            if tracker.run_id is not None:
                _end_runs_of_killed_attempts(config, work_dir, lock)
            done, reports = _run_steps(steps, config, paths, tracker, only, data_dir, rerun)
    return done, reports


def runs_step(name: str, only: str | None, until: str | None) -> bool:
    """Whether a run with these `only` / `until` options runs (or skips) step `name`."""
    if only is not None:
        return only == name
    return until is None or STEP_NAMES.index(name) <= STEP_NAMES.index(until)


def _run_steps(
    steps: list[_Step],
    config: ExperimentConfig,
    paths: ExperimentPaths,
    tracker: Tracker,
    only: str | None,
    data_dir: Path | None,
    rerun: Collection[str],
) -> tuple[PipelineOutputs, list[StepReport]]:
    """Run (or skip) `steps` in order, recording each one that ran in the state file."""
    state_path = paths.pipeline_dir / STATE_FILE
    state = _read_state(paths)
    done, reports = PipelineOutputs(), []
    for step in steps:
        if step.name == "prepare_data" and data_dir is not None:
            report = StepReport(step.name, "given", 0.0, _given(data_dir))
        else:
            report = _run_step(step, config, paths, done, state, tracker, only, rerun)
            if report.status == "ran":
                with atomic_file(state_path) as tmp:
                    tmp.write_text(json.dumps(state, indent=2) + "\n")
        setattr(done, step.field, report.outputs)
        reports.append(report)
        if _before_training(step, steps):
            wait_for_everyone()  # the other processes of a distributed run wait for this step (`_follow`)
    tracker.log_params({f"step.{r.name}": r.status for r in reports})
    return done, reports


def _follow(
    steps: list[_Step], config: ExperimentConfig, paths: ExperimentPaths, data_dir: Path | None, rerun: Collection[str]
) -> tuple[PipelineOutputs, list[StepReport]]:
    """What a process other than the first of a distributed run does: it waits for the first to run (or skip) each
    step before training, reads their outputs, and trains beside it. The lock, the state file, MLflow and every
    write are the first process's; steps after training are too."""
    if TRAIN_STEP not in [step.name for step in steps]:
        return PipelineOutputs(), []
    done, reports = PipelineOutputs(), []
    for step in steps[: [s.name for s in steps].index(TRAIN_STEP) + 1]:
        if step.name == TRAIN_STEP:  # all processes train; what a process writes, only the first writes
            report = _run_step(step, config, paths, done, _read_state(paths), OfflineTracker(), None, rerun)
        else:
            wait_for_everyone()  # the first process has run or skipped the step
            report = _followed_step(step, config, paths, done, data_dir)
        setattr(done, step.field, report.outputs)
        reports.append(report)
    return done, reports


def _followed_step(
    step: _Step, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs, data_dir: Path | None
) -> StepReport:
    """A step the first process ran or skipped: its outputs, as the state file records them."""
    if step.name == "prepare_data" and data_dir is not None:
        return StepReport(step.name, "given", 0.0, _given(data_dir))
    inputs = step.inputs(config, done)
    if inputs is None:
        return StepReport(step.name, "not applicable", 0.0, None)
    outputs = _previous_outputs(step, _read_state(paths).get(step.name), _fingerprint(inputs))
    if outputs is None:
        raise RecsysError(
            f"step {step.name} of {config.name} is not done after the first process ran it. Fix: see the first "
            "process's log for its error"
        )
    return StepReport(step.name, "skipped", 0.0, outputs)


def _before_training(step: _Step, steps: list[_Step]) -> bool:
    """Whether `step` comes before the train step in `steps` (the other processes of a distributed run wait for it)."""
    names = [s.name for s in steps]
    return TRAIN_STEP in names and names.index(step.name) < names.index(TRAIN_STEP)


def _read_state(paths: ExperimentPaths) -> dict[str, dict[str, Any]]:
    state_path = paths.pipeline_dir / STATE_FILE
    return json.loads(state_path.read_text()) if state_path.exists() else {}


def _remove_temporaries(paths: ExperimentPaths) -> None:
    """Remove what killed runs of this pipeline left of their atomic writes (`recsys.runtime.atomic`): beside and in
    its output directories, its training states and its state file. Only under the pipeline's lock: no one else
    writes them."""
    removed = remove_temporaries(paths.pipeline_dir)
    for out_dir in paths.outputs():
        removed += remove_temporaries(out_dir.parent, glob.escape(out_dir.name)) + remove_temporaries(out_dir)
    state = training_state_path(paths.model_dir)  # and the per-domain ones, NAME.training-state.DOMAIN.dcp
    removed += remove_temporaries(state.parent, f"{glob.escape(state.stem)}*{state.suffix}")
    teacher_cache = teacher_cache_path(paths.model_dir)
    removed += remove_temporaries(teacher_cache.parent, glob.escape(teacher_cache.name))
    if removed:
        logger.warning("removed what interrupted runs left: %s", ", ".join(map(str, removed)))


def _run_tags(work_dir: Path, config: ExperimentConfig, lock: HeldLock) -> dict[str, str]:
    """The pipeline run's tags: whose run it is (this pipeline under this work dir) and which holder of its lock ran
    it, so a later run can tell a run left RUNNING by a killed process from a live one."""
    holder = lock.holder
    return {WORK_DIR_TAG: str(work_dir.resolve()), PIPELINE_TAG: config.name, HOST_TAG: holder.host,
            PID_TAG: str(holder.pid), LOCK_TOKEN_TAG: holder.token}  # fmt: skip


def _end_runs_of_killed_attempts(config: ExperimentConfig, work_dir: Path, lock: HeldLock) -> None:
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


def _run_step(
    step: _Step,
    config: ExperimentConfig,
    paths: ExperimentPaths,
    done: PipelineOutputs,
    state: dict[str, dict[str, Any]],
    tracker: Tracker,
    only: str | None,
    rerun: Collection[str],
) -> StepReport:
    """Skip the step when it is up to date, else run it (inside a nested MLflow run) and record it in `state`."""
    inputs = step.inputs(config, done)
    if inputs is None:
        return StepReport(step.name, "not applicable", 0.0, None)
    fingerprint = _fingerprint(inputs)
    previous = _previous_outputs(step, state.get(step.name), fingerprint)
    if previous is not None and step.name not in rerun:
        logger.info("step %s: up to date, skipped", step.name)
        return StepReport(step.name, "skipped", 0.0, previous)
    if only is not None and step.name != only:
        raise RecsysError(
            f"step {step.name} is not up to date for {config.name}. Fix: run it first "
            f"(`recsys pipeline run --config ... --step {step.name}`, or its Airflow task)"
        )
    if step.name in rerun and step.fresh_start is not None and Workers.from_environment().is_main:
        step.fresh_start(paths)
    if step.name == TRAIN_STEP:
        wait_for_everyone()  # every process of a distributed run then reads the same training state (or none)
    start = time.perf_counter()
    logger.info("step %s: running", step.name)
    if step.own_run or tracker.run_id is None:  # train, evaluate and register open their own nested runs
        outputs = step.run(config, paths, done)
    else:
        with start_tracking(config.tracking, config.experiment_name, step.name) as step_tracker:
            step_tracker.log_params(inputs)
            outputs = step.run(config, paths, done)
            step_tracker.log_metrics(_numbers(outputs.summary()))
    state[step.name] = {"fingerprint": fingerprint, "outputs": _json(outputs)}
    return StepReport(step.name, "ran", time.perf_counter() - start, outputs)


def _previous_outputs(step: _Step, recorded: dict[str, Any] | None, fingerprint: str) -> Output | None:
    """The outputs a previous run recorded for the same inputs, when they still exist; None otherwise."""
    if recorded is None or recorded["fingerprint"] != fingerprint:
        return None
    try:
        outputs: Output = TypeAdapter(step.output).validate_python(recorded["outputs"])
    except ValidationError:  # recorded by an earlier version of the runner
        return None
    return outputs if all(p.exists() for p in step.produces(outputs)) else None


def _given(data_dir: Path) -> PreparedData:
    if not (data_dir / META_FILE).is_file():
        raise RecsysError(f"{data_dir} is not a prepared directory (no {META_FILE}). Fix: `recsys data prepare` it")
    return PreparedData(data_dir, _files_sha256(data_dir))


# ------------------------------------------------------------------------------------------------- the steps


@dataclass(frozen=True)
class _Step:
    name: str  # what `--step` and the Airflow tasks call it
    field: str  # the PipelineOutputs field it fills
    output: type
    inputs: Callable[[ExperimentConfig, PipelineOutputs], dict[str, Any] | None]  # None: not applicable
    run: Callable[[ExperimentConfig, ExperimentPaths, PipelineOutputs], Any]
    produces: Callable[[Any], list[Path]]  # what must still exist for a skip
    own_run: bool = False  # the step opens its own MLflow run
    fresh_start: Callable[[ExperimentPaths], None] | None = None  # drops what the step would resume from (`rerun`)


def _prepare(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> PreparedData:
    data_dir = prepare_step(config.data, paths.data_dir)
    return PreparedData(data_dir, _files_sha256(data_dir))


def _content_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    if config.sid is None:
        return None  # only an experiment with a `sid` section embeds the items' text
    inputs = {"content": config.sid.model_dump(mode="json")["content"], "data": _json(done.data)}
    queries = _training_queries(config)
    return inputs if queries is None else {**inputs, "training_queries": asdict(queries)}


def _content(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> ContentEmbeddings:
    assert config.sid is not None and done.data is not None
    data_dir, content = done.data.data_dir, config.sid.content
    path = embed_content_step(content, data_dir, paths.content_dir, paths.cache_dir)
    settings = _training_queries(config)
    if settings is None:
        return ContentEmbeddings(path, encoder=content.model)
    queries = embed_training_queries(content, settings.queries_per_item, settings.query_seed, data_dir,
                                     paths.content_dir, paths.cache_dir)  # fmt: skip
    return ContentEmbeddings(path, queries, content.model)


def _training_queries(config: ExperimentConfig) -> QueryAwareTraining | None:
    """The query settings of a query-aware model (its training queries are made with the content), else None."""
    settings = config.model.training_settings()
    return settings if isinstance(settings, QueryAwareTraining) else None


def _sid_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    if config.sid is None:
        return None
    return {"sid": config.sid.model_dump(mode="json"), "data": _json(done.data), "content": _json(done.content)}


def _sids(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> SemanticIds:
    assert config.sid is not None and done.data is not None and done.content is not None
    return SemanticIds(build_semantic_ids_step(config.sid, done.data.data_dir, done.content.path, paths.sid_dir))


# budgets bound a run and processes spread it, neither sets what it learns: changing one leaves a finished step current
HOW_IT_RUNS = {
    "train": {"max_memory_gb", "nproc_per_node", "shard_item_table"},
    "eval": {"max_seconds", "max_memory_gb"},
    "distill": {"teacher_batch_size"},
}


def _train_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any]:
    student = {"distill"} if config.distill is not None else set()  # (absent: the fingerprints of before it came)
    # the intervals are the evaluate step's: they do not change what training makes
    exclude = {**HOW_IT_RUNS, "eval": HOW_IT_RUNS["eval"] | {"uncertainty"}}
    sections = config.model_dump(mode="json", include={"model", "train", "eval", *student}, exclude=exclude)
    upstream = {role: model_sha256(path, _config_key(role)) for role, path in config.model.upstream_dirs().items()}
    if config.distill is not None:
        upstream["teacher"] = model_sha256(config.distill.teacher_dir, TEACHER_KEY)
    features = {"sids": _json(done.semantic_ids), "content": _json(done.content)}
    data = {"domain": config.data.domain, "stream_parts": config.data.stream_parts, "data": _json(done.data)}
    return {**sections, **data, **features, "upstream": upstream}


def _config_key(role: str) -> str:
    """The config key naming an upstream model directory of `role` (`ModelSection.upstream_dirs`)."""
    return "model.members" if role.startswith("member") else f"model.{role}_dir"


def _train(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> TrainOutputs:
    assert done.data is not None
    return train_step(config, done.data.data_dir, paths.model_dir, done.features())


def _index_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    assert done.model is not None
    if not done.model.item_vectors:
        return None
    return {"index": dataclasses.asdict(config.pipeline.index), "model_sha256": done.model.model_sha256}


def _index(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> IndexOutputs:
    # imported on use: faiss loads for this step only (a run that stops before it needs no faiss)
    from pipelines.index import build_index_step
    from recsys.retrieval.faiss_index import FaissTopK

    assert done.model is not None
    index_dir = build_index_step(
        done.model.model_dir, paths.index_dir, config.pipeline.index, model_sha=done.model.model_sha256
    )
    report = FaissTopK.read_report(index_dir)
    assert report is not None  # build_index_step writes it
    return IndexOutputs(index_dir, report.recall, report.k)


def _evaluate_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any]:
    assert done.model is not None
    eval_section = config.model_dump(mode="json", include={"eval"}, exclude=HOW_IT_RUNS)["eval"]
    inputs = {"eval": eval_section, "model_sha256": done.model.model_sha256, "sids": _json(done.semantic_ids)}
    if config.distill is not None:  # the report records the teacher (a student evaluated before it did re-runs)
        inputs["distill"] = config.model_dump(mode="json", include={"distill"}, exclude=HOW_IT_RUNS)["distill"]
    search = _search_content(config, done)
    return inputs if search is None else {**inputs, "search_content": search}


def _search_content(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, str] | None:
    """The digests of the content a query-aware model's search slices are made from (its embeddings: the
    neighbour-mix level; its training queries: what test queries differ from); None for any other model."""
    if _training_queries(config) is None or done.content is None or done.content.queries is None:
        return None
    return {"content_embeddings": file_sha256(done.content.path), "training_queries": file_sha256(done.content.queries)}


def _evaluate(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> EvaluateOutputs:
    assert done.model is not None
    return evaluate_step(config, done.model, paths.evaluation_dir, done.features(), paths.cache_dir)


def _register_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    if not config.tracking.enabled:
        return None  # the registry is MLflow's
    assert done.model is not None
    return {
        "registry": config.pipeline.registry.model_dump(mode="json"),
        "uncertainty": dataclasses.asdict(config.eval.uncertainty),  # the strict gate's interval
        "model_sha256": done.model.model_sha256,
        "index": _json(done.index),
        "sids": _json(done.semantic_ids),
    }


def _register(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> Registration:
    assert done.model is not None
    bundle = Bundle.write(
        paths.bundle_dir, name=config.name, model_dir=done.model.model_dir,
        index_dir=None if done.index is None else done.index.index_dir, semantic_ids=done.features().semantic_ids,
        source={"model_sha256": done.model.model_sha256, "config": config.model_dump(mode="json")},
    )  # fmt: skip
    registry = config.pipeline.registry
    gate = GateRule(registry.gate, registry.tolerance, config.eval.uncertainty)
    decision = register_bundle(bundle, config.registered_model_name, config.tracking.resolved_uri(), gate)
    return Registration(bundle.path, decision)


STEPS = [
    _Step(
        "prepare_data", "data", PreparedData, lambda config, done: {"data": data_fingerprint(config.data)}, _prepare,
        lambda o: [o.data_dir / META_FILE],
    ),
    _Step(
        "embed_content", "content", ContentEmbeddings, _content_inputs, _content,
        lambda o: [o.path, *([] if o.queries is None else [o.queries])],
    ),
    _Step(
        "build_semantic_ids", "semantic_ids", SemanticIds, _sid_inputs, _sids, lambda o: [o.path],
        fresh_start=lambda paths: (paths.sid_dir / SEMANTIC_IDS_FILE).unlink(missing_ok=True),
    ),
    _Step(
        TRAIN_STEP, "model", TrainOutputs, _train_inputs, _train, lambda o: [o.model_dir / MODEL_FILE],
        own_run=True, fresh_start=lambda paths: shutil.rmtree(training_state_path(paths.model_dir), ignore_errors=True),
    ),
    _Step("build_index", "index", IndexOutputs, _index_inputs, _index, lambda o: [o.index_dir / INDEX_FILE]),
    _Step(
        "evaluate", "evaluation", EvaluateOutputs, _evaluate_inputs, _evaluate,
        lambda o: [o.evaluation_dir / EVALUATION_FILE], own_run=True,
    ),
    _Step(
        "register", "registration", Registration, _register_inputs, _register, lambda o: [o.bundle_dir / BUNDLE_FILE],
        own_run=True,
    ),
]  # fmt: skip
STEP_NAMES = [step.name for step in STEPS]
STEP_BEFORE_TRAINING = STEP_NAMES[STEP_NAMES.index(TRAIN_STEP) - 1]  # what a launcher runs before its processes train


def _json(outputs: Output | None) -> Any:
    """A step's outputs as JSON: in its recorded state, and as they enter a fingerprint (None: not applicable)."""
    return None if outputs is None else TypeAdapter(type(outputs)).dump_python(outputs, mode="json")


def _fingerprint(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _files_sha256(directory: Path) -> str:
    """SHA-256 over the names and bytes of a directory's files (a prepared directory: a few files)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(directory)).encode())
        feed_file(digest, file)
    return digest.hexdigest()


def _numbers(summary: dict[str, object]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
