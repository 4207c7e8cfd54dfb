"""`recsys pipeline run`: prepare_data -> embed_content -> build_semantic_ids -> train_retriever -> build_index ->
evaluate -> register.

Each step is a function `(config, inputs) -> outputs` (JSON-able dicts) whose work is written atomically. The
runner fingerprints every step's inputs (its config sections and its upstream steps' outputs) and records
(fingerprint, outputs) in `WORK/pipelines/NAME/state.json` (rewritten atomically after each step), so a
re-run skips every step whose inputs did not change and whose outputs still exist, and a run that crashed
resumes at the step that failed. With tracking on, the pipeline is one MLflow run and each step that runs
is a nested run of it (params = its inputs, metrics = its numeric outputs).

Steps that do not apply are recorded as such: no `sid` section -> no content embeddings and no semantic IDs;
a model without item vectors (generative, popularity) -> no index.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.content import embed_content_step
from pipelines.data import data_fingerprint, prepare_step
from pipelines.evaluate import EVALUATION_FILE, evaluate_step
from pipelines.experiment import ExperimentPaths, with_item_features
from pipelines.index import build_index_step
from pipelines.model_dir import model_sha256
from pipelines.registry import register_bundle, write_bundle
from pipelines.semantic_ids import build_semantic_ids_step
from pipelines.tracking import Tracker, start_tracking
from pipelines.train import train_step
from recsys.errors import RecsysError
from recsys.models.registry import VECTOR_MODELS
from recsys.retrieval.faiss_index import FaissTopK
from recsys.runtime.atomic import atomic_file

logger = logging.getLogger(__name__)

Outputs = dict[str, Any]
STATE_FILE = "state.json"


@dataclass(frozen=True)
class StepReport:
    name: str
    status: str  # "ran", "skipped" (up to date) or "not applicable"
    seconds: float
    outputs: Outputs


@dataclass(frozen=True)
class _Step:
    name: str
    inputs: Callable[[ExperimentConfig, dict[str, Outputs]], dict[str, Any] | None]  # None: not applicable
    run: Callable[[ExperimentConfig, ExperimentPaths, dict[str, Outputs]], Outputs]
    produces: Callable[[Outputs], list[Path]]  # what must still exist for a skip


def run_pipeline(config: ExperimentConfig, work_dir: Path, only: str | None = None) -> list[StepReport]:
    """Run the pipeline of `config` under `work_dir`, skipping up-to-date steps; returns one report per step.

    Args:
        only: run just this step (an Airflow task): the steps before it must be up to date (else
            `RecsysError` says which one to run), the steps after it are left alone.
    """
    if only is not None and only not in STEP_NAMES:
        raise RecsysError(f"unknown pipeline step {only!r}. Fix: one of {', '.join(STEP_NAMES)}")
    paths = ExperimentPaths.under(work_dir, config)
    state_path = work_dir / "pipelines" / config.name / STATE_FILE
    state: dict[str, dict[str, Any]] = json.loads(state_path.read_text()) if state_path.exists() else {}
    done: dict[str, Outputs] = {}
    reports = []
    run_name = f"pipeline {config.name}" + (f": {only}" if only else "")
    with start_tracking(config.tracking, config.experiment_name, run_name) as tracker:
        for step in STEPS[: STEP_NAMES.index(only) + 1] if only else STEPS:
            inputs = step.inputs(config, done)
            if inputs is None:
                done[step.name] = {}
                reports.append(StepReport(step.name, "not applicable", 0.0, {}))
                continue
            fingerprint = _fingerprint(inputs)
            previous = state.get(step.name)
            if previous and previous["fingerprint"] == fingerprint and _exist(step.produces(previous["outputs"])):
                done[step.name] = previous["outputs"]
                reports.append(StepReport(step.name, "skipped", 0.0, previous["outputs"]))
                logger.info("step %s: up to date, skipped", step.name)
                continue
            if only is not None and step.name != only:
                raise RecsysError(
                    f"step {step.name} is not up to date for {config.name}. Fix: run it first "
                    f"(`recsys pipeline run --config ... --step {step.name}`, or its Airflow task)"
                )
            start = time.perf_counter()
            logger.info("step %s: running", step.name)
            outputs = _run_tracked(step, config, paths, done, inputs, tracker)
            done[step.name] = outputs
            state[step.name] = {"fingerprint": fingerprint, "outputs": outputs}
            with atomic_file(state_path) as tmp:
                tmp.write_text(json.dumps(state, indent=2) + "\n")
            reports.append(StepReport(step.name, "ran", time.perf_counter() - start, outputs))
        tracker.log_params({f"step.{r.name}": r.status for r in reports})
    return reports


def _run_tracked(
    step: _Step, config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs], inputs: dict[str, Any],
    tracker: Tracker,
) -> Outputs:  # fmt: skip
    """The step inside a nested MLflow run (train_retriever, evaluate and register open their own nested runs)."""
    if step.name in ("train_retriever", "evaluate", "register") or tracker.run_id is None:
        return step.run(config, paths, done)
    with start_tracking(config.tracking, config.experiment_name, step.name) as step_tracker:
        step_tracker.log_params(inputs)
        outputs = step.run(config, paths, done)
        step_tracker.log_metrics(_flat_numbers(outputs))
    return outputs


# ------------------------------------------------------------------------------------------------- the steps


def _prepare_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any]:
    return {"data": data_fingerprint(config.data)}


def _prepare(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    return {"data_dir": str(prepare_step(config.data, paths.data_dir))}


def _content_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any] | None:
    if config.sid is None:
        return None  # only semantic IDs read content embeddings today
    return {"content": config.sid.model_dump(mode="json")["content"], "data": done["prepare_data"]}


def _content(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    assert config.sid is not None
    data_dir = Path(done["prepare_data"]["data_dir"])
    path = embed_content_step(config.sid.content, data_dir, paths.content_dir, paths.cache_dir)
    return {"content_embeddings": str(path)}


def _sid_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any] | None:
    if config.sid is None:
        return None
    return {"sid": config.sid.model_dump(mode="json"), "data": done["prepare_data"], "content": done["embed_content"]}


def _sids(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    assert config.sid is not None
    data_dir, embeddings = Path(done["prepare_data"]["data_dir"]), Path(done["embed_content"]["content_embeddings"])
    return {"semantic_ids": str(build_semantic_ids_step(config.sid, data_dir, embeddings, paths.sid_dir))}


def _train_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any]:
    sections = config.model_dump(mode="json", include={"model", "train", "eval"})
    features = {"sids": done["build_semantic_ids"], "content": done["embed_content"]}
    return {**sections, "data": done["prepare_data"], **features}


def _train(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    if sids := done["build_semantic_ids"].get("semantic_ids"):  # with the `sid` section: both
        config = with_item_features(config, sids, done["embed_content"]["content_embeddings"])
    outputs = train_step(config, Path(done["prepare_data"]["data_dir"]), paths.model_dir)
    return {
        "model_dir": str(outputs.model_dir),
        "model_sha256": model_sha256(outputs.model_dir),
        "valid_ndcg@10": outputs.metrics["valid"]["ndcg@10"],
        "test_ndcg@10": outputs.metrics["test"]["ndcg@10"],
        "test_recall@10": outputs.metrics["test"]["recall@10"],
        "mlflow_run_id": outputs.run_id,
    }


def _index_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any] | None:
    if config.model.name not in VECTOR_MODELS:
        return None
    return {"index": asdict(config.pipeline.index), "model_sha256": done["train_retriever"]["model_sha256"]}


def _index(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    index_dir = build_index_step(Path(done["train_retriever"]["model_dir"]), paths.index_dir, config.pipeline.index)
    report = FaissTopK.read_report(index_dir)
    assert report is not None  # build_index_step writes it
    return {"index_dir": str(index_dir), "recall@k": report.recall, "k": report.k}


def _evaluate_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any]:
    return {
        "eval": config.model_dump(mode="json", include={"eval"})["eval"],
        "model_sha256": done["train_retriever"]["model_sha256"],
        "sids": done["build_semantic_ids"],
    }


def _evaluate(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    sids = done["build_semantic_ids"].get("semantic_ids")
    outputs = evaluate_step(
        config, Path(done["train_retriever"]["model_dir"]), paths.evaluation_dir,
        sid_path=Path(sids) if sids else None, training_run_id=done["train_retriever"].get("mlflow_run_id"),
    )  # fmt: skip
    overall = outputs.report["overall"]
    return {
        "evaluation_dir": str(outputs.evaluation_dir),
        "test_ndcg@10": overall.get("ndcg@10"),
        "slices": sum(len(entries) for entries in outputs.report["slices"].values()),
        "mlflow_run_id": outputs.run_id,
    }


def _register_inputs(config: ExperimentConfig, done: dict[str, Outputs]) -> dict[str, Any] | None:
    if not config.tracking.enabled:
        return None  # the registry is MLflow's
    return {
        "registry": config.pipeline.registry.model_dump(mode="json"),
        "model_sha256": done["train_retriever"]["model_sha256"],
        "index": done["build_index"],
        "sids": done["build_semantic_ids"],
    }


def _register(config: ExperimentConfig, paths: ExperimentPaths, done: dict[str, Outputs]) -> Outputs:
    index_dir, sids = done["build_index"].get("index_dir"), done["build_semantic_ids"].get("semantic_ids")
    bundle = write_bundle(
        paths.bundle_dir, name=config.name, model_dir=Path(done["train_retriever"]["model_dir"]),
        index_dir=Path(index_dir) if index_dir else None, sid_path=Path(sids) if sids else None,
        source={"model_sha256": done["train_retriever"]["model_sha256"], "config": config.model_dump(mode="json")},
    )  # fmt: skip
    decision = register_bundle(
        bundle, config.registered_model_name, config.tracking.resolved_uri(), config.pipeline.registry.tolerance
    )
    return {"bundle_dir": str(bundle), **asdict(decision)}


STEPS = [
    _Step("prepare_data", _prepare_inputs, _prepare, lambda o: [Path(o["data_dir"])]),
    _Step("embed_content", _content_inputs, _content, lambda o: [Path(o["content_embeddings"])]),
    _Step("build_semantic_ids", _sid_inputs, _sids, lambda o: [Path(o["semantic_ids"])]),
    _Step("train_retriever", _train_inputs, _train, lambda o: [Path(o["model_dir"]) / "model.pt"]),
    _Step("build_index", _index_inputs, _index, lambda o: [Path(o["index_dir"]) / "index.faiss"]),
    _Step("evaluate", _evaluate_inputs, _evaluate, lambda o: [Path(o["evaluation_dir"]) / EVALUATION_FILE]),
    _Step("register", _register_inputs, _register, lambda o: [Path(o["bundle_dir"])]),
]


STEP_NAMES = [step.name for step in STEPS]


def _fingerprint(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _exist(paths: list[Path]) -> bool:
    return all(p.exists() for p in paths)


def _flat_numbers(outputs: Outputs) -> dict[str, float]:
    return {k: float(v) for k, v in outputs.items() if isinstance(v, int | float) and not isinstance(v, bool)}
