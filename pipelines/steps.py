"""The pipeline's steps, in order, and what each one's fingerprint is made of: prepare_data -> enrich_items ->
embed_content -> build_semantic_ids -> train_retriever -> build_index -> evaluate -> register (`pipelines.runner` runs
them).

Each step is a function `(config, paths, outputs so far) -> its outputs` (a frozen dataclass) whose work is written
atomically, and a function of the same arguments giving its inputs as JSON (None: the step does not apply). The
runner fingerprints those inputs: a step whose inputs did not change and whose outputs still exist is skipped.

LLM-written item metadata is made with an `enrich` section, and read by the consumers that name its columns
(`recsys.enrich.columns`). Which other steps apply follows from what the model's family reads
(`recsys.models.family.Input`): content embeddings when it reads content, item texts or queries (or a `sid` section
builds semantic IDs from them), training queries beside them when it reads queries, semantic IDs with a `sid`
section, an index when the trained model has item vectors, a registration when tracking is on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from pipelines.bundle import BUNDLE_FILE, Bundle
from pipelines.config import ExperimentConfig
from pipelines.content import embed_content_step, embed_training_queries
from pipelines.data import data_fingerprint, prepare_step
from pipelines.distill import TEACHER_KEY
from pipelines.evaluate import EvaluateOutputs, evaluate_step
from pipelines.evaluation_dir import EVALUATION_FILE
from pipelines.model_dir import MODEL_FILE, file_sha256, model_sha256
from pipelines.registry import GateDecision, GateRule, register_bundle
from pipelines.semantic_ids import build_semantic_ids_step, reads_text
from pipelines.train import CatalogFeatures, TrainOutputs, train_step, training_state_path
from recsys.data.schema import META_FILE, METADATA_FILE
from recsys.errors import ConfigError, RecsysError
from recsys.models.family import CONTENT_INPUTS, Input
from recsys.retrieval.config import INDEX_FILE
from recsys.runtime.digest import feed_file
from recsys.semantic_ids.codes import SEMANTIC_IDS_FILE
from recsys.training.recipes import QueryTraining

TRAIN_STEP = "train_retriever"  # the step every process of a distributed run takes part in


@dataclass(frozen=True)
class ExperimentPaths:
    """Where an experiment keeps its prepared data, semantic IDs, model, index, evaluation, bundle and cache."""

    data_dir: Path
    metadata_dir: Path  # item_metadata.parquet of the `enrich_items` step
    content_dir: Path
    sid_dir: Path
    model_dir: Path
    cache_dir: Path
    enrich_cache_dir: Path  # the LLM's answers, shared by experiments (and its converted local model)
    index_dir: Path
    bundle_dir: Path
    evaluation_dir: Path  # evaluation.json (slices) and dashboard.html of the `evaluate` step
    pipeline_dir: Path  # the runner's: state.json and the lock

    @staticmethod
    def under(work_dir: Path, config: ExperimentConfig) -> ExperimentPaths:
        return ExperimentPaths(
            data_dir=work_dir / "data" / config.name,
            metadata_dir=work_dir / "metadata" / config.name,
            content_dir=work_dir / "content" / config.name,
            sid_dir=work_dir / "sids" / config.name,
            model_dir=work_dir / "models" / config.name,
            cache_dir=work_dir / "cache" / "embeddings",
            enrich_cache_dir=work_dir / "cache" / "enrich",
            index_dir=work_dir / "indexes" / config.name,
            bundle_dir=work_dir / "bundles" / config.name,
            evaluation_dir=work_dir / "evaluations" / config.name,
            pipeline_dir=work_dir / "pipelines" / config.name,
        )

    def outputs(self) -> list[Path]:
        """The steps' output directories: this experiment's alone (the embeddings cache is shared, so not one)."""
        return [self.data_dir, self.metadata_dir, self.content_dir, self.sid_dir, self.model_dir, self.index_dir,
                self.bundle_dir, self.evaluation_dir]  # fmt: skip


# ------------------------------------------------------------------------------------------- the steps' outputs


@dataclass(frozen=True)
class PreparedData:
    data_dir: Path
    sha256: str  # of its files: what the steps downstream of the data depend on

    def summary(self) -> dict[str, object]:
        return {"data_dir": self.data_dir}


@dataclass(frozen=True)
class ItemMetadata:
    path: Path  # item_metadata.parquet
    sha256: str  # of it: the consumers downstream depend on its records

    def summary(self) -> dict[str, object]:
        return {"item_metadata": self.path}


@dataclass(frozen=True)
class ContentEmbeddings:
    path: Path  # content_embeddings.npy
    queries: Path | None = None  # training_queries.npz, for a model that reads queries
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


Output = (
    PreparedData
    | ItemMetadata
    | ContentEmbeddings
    | SemanticIds
    | TrainOutputs
    | IndexOutputs
    | EvaluateOutputs
    | Registration
)


@dataclass
class PipelineOutputs:
    """What the steps have produced so far (None: not run yet, or not applicable)."""

    data: PreparedData | None = None
    metadata: ItemMetadata | None = None
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
            item_metadata=None if self.metadata is None else self.metadata.path,
        )


@dataclass(frozen=True)
class Step:
    name: str  # what `--step` and the Airflow tasks call it
    field: str  # the PipelineOutputs field it fills
    output: type
    inputs: Callable[[ExperimentConfig, PipelineOutputs], dict[str, Any] | None]  # None: not applicable
    run: Callable[[ExperimentConfig, ExperimentPaths, PipelineOutputs], Any]
    produces: Callable[[Any], list[Path]]  # what must still exist for a skip
    own_run: bool = False  # the step opens its own MLflow run
    fresh_start: Callable[[ExperimentPaths], None] | None = None  # drops what the step would resume from (`rerun`)


# --------------------------------------------------------------------------------------------------- the steps


def _prepare(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> PreparedData:
    data_dir = prepare_step(config.data, paths.data_dir)
    return PreparedData(data_dir, files_sha256(data_dir))


# how an enrichment runs, not what it writes: changing one leaves finished records current
ENRICH_RUNTIME = {"batch_size", "device", "threads", "concurrency", "requests_per_s", "timeout_s", "max_retries"}


def _enrich_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    if config.enrich is None:
        return None
    section = config.model_dump(mode="json", include={"enrich"}, exclude={"enrich": ENRICH_RUNTIME})["enrich"]
    records = config.enrich.records
    seed = None if records is None else file_sha256(Path(records))
    return {"enrich": section, "records_sha256": seed, "data": as_json(done.data)}


def _enrich(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> ItemMetadata:
    from pipelines.enrich import enrich_step  # the LLM backends load for this step only

    assert config.enrich is not None and done.data is not None
    enrich_step(config.enrich, done.data.data_dir, paths.metadata_dir, paths.enrich_cache_dir)
    path = paths.metadata_dir / METADATA_FILE
    return ItemMetadata(path, file_sha256(path))


def _content_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    if (config.sid is None or not reads_text(config.sid)) and not config.model.reads() & CONTENT_INPUTS:
        return None  # nothing reads the items' text
    inputs = {"content": config.model_dump(mode="json", include={"content"})["content"], "data": as_json(done.data)}
    if done.metadata is not None:
        inputs["metadata"] = as_json(done.metadata)
    queries = training_queries(config)
    if queries is None:
        return inputs
    return {**inputs, "training_queries": {"per_item": queries.queries_per_item, "seed": queries.query_seed}}


def _content(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> ContentEmbeddings:
    assert done.data is not None
    data_dir, content = done.data.data_dir, config.content
    metadata = None if done.metadata is None else done.metadata.path
    path = embed_content_step(content, data_dir, paths.content_dir, paths.cache_dir, metadata)
    settings = training_queries(config)
    if settings is None:
        return ContentEmbeddings(path, encoder=content.model)
    queries = embed_training_queries(content, settings, data_dir, paths.content_dir, paths.cache_dir, metadata)
    return ContentEmbeddings(path, queries, content.model)


def training_queries(config: ExperimentConfig) -> QueryTraining | None:
    """How training queries are made for a model that reads queries (its training settings), else None."""
    if Input.QUERIES not in config.model.reads():
        return None
    settings = config.model.training_settings()
    if not isinstance(settings, QueryTraining):
        raise ConfigError(
            f"model {config.model.name!r} reads queries, and its training ({type(settings).__name__}) makes none. "
            'Fix: give its family a training with query settings ("queries", recsys.training.recipes)'
        )
    return settings


def _sid_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
    if config.sid is None:
        return None
    return {"sid": config.sid.model_dump(mode="json"), "data": as_json(done.data), "content": as_json(done.content)}


def _sids(config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> SemanticIds:
    assert config.sid is not None and done.data is not None
    assert done.content is not None or not reads_text(config.sid), "the content step runs when the vectors read text"
    embeddings = None if done.content is None else done.content.path
    return SemanticIds(
        build_semantic_ids_step(config.sid, config.content, done.data.data_dir, embeddings, paths.sid_dir)
    )


# budgets bound a run and processes spread it, neither sets what it learns: changing one leaves a finished step current
HOW_IT_RUNS: dict[str, Any] = {
    "train": {"hardware": {"max_memory_gb"}, "distributed": True},
    "eval": {"max_seconds", "max_memory_gb"},
    "distill": {"teacher_batch_size"},
}


def _train_inputs(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any]:
    student = {"distill"} if config.distill is not None else set()  # (absent: the fingerprints of before it came)
    # the intervals are the evaluate step's: they do not change what training makes
    exclude = {**HOW_IT_RUNS, "eval": HOW_IT_RUNS["eval"] | {"uncertainty"}}
    sections = config.model_dump(mode="json", include={"model", "train", "eval", *student}, exclude=exclude)
    model = config.model
    upstream = {entry: model_sha256(path, model.upstream_key(entry)) for entry, path in model.upstream_dirs().items()}
    if config.distill is not None:
        upstream["teacher"] = model_sha256(config.distill.teacher_dir, TEACHER_KEY)
    features = {"sids": as_json(done.semantic_ids), "content": as_json(done.content)}
    data = {"domain": config.data.domain, "data": as_json(done.data)}
    return {**sections, **data, **features, "upstream": upstream}


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
    inputs = {"eval": eval_section, "model_sha256": done.model.model_sha256, "sids": as_json(done.semantic_ids)}
    if config.distill is not None:  # the report records the teacher (a student evaluated before it did re-runs)
        inputs["distill"] = config.model_dump(mode="json", include={"distill"}, exclude=HOW_IT_RUNS)["distill"]
    baseline = config.pipeline.compare_with
    if baseline is not None:  # the comparison is redone when the baseline is evaluated again
        inputs["compare_with"] = {"dir": str(baseline), "evaluation": _digest_or_none(baseline / EVALUATION_FILE)}
    search = _search_content(config, done)
    return inputs if search is None else {**inputs, "search_content": search}


def _digest_or_none(path: Path) -> str | None:
    return file_sha256(path) if path.is_file() else None


def _search_content(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, str] | None:
    """The digests of the content a model that reads queries has its search slices made from (its embeddings: the
    neighbour-mix level; its training queries: what test queries differ from); None for any other model."""
    if Input.QUERIES not in config.model.reads() or done.content is None or done.content.queries is None:
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
        "index": as_json(done.index),
        "sids": as_json(done.semantic_ids),
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
    Step(
        "prepare_data", "data", PreparedData, lambda config, done: {"data": data_fingerprint(config.data)}, _prepare,
        lambda o: [o.data_dir / META_FILE],
    ),
    Step(
        "enrich_items", "metadata", ItemMetadata, _enrich_inputs, _enrich,
        lambda o: [o.path],
    ),
    Step(
        "embed_content", "content", ContentEmbeddings, _content_inputs, _content,
        lambda o: [o.path, *([] if o.queries is None else [o.queries])],
    ),
    Step(
        "build_semantic_ids", "semantic_ids", SemanticIds, _sid_inputs, _sids, lambda o: [o.path],
        fresh_start=lambda paths: (paths.sid_dir / SEMANTIC_IDS_FILE).unlink(missing_ok=True),
    ),
    Step(
        TRAIN_STEP, "model", TrainOutputs, _train_inputs, _train, lambda o: [o.model_dir / MODEL_FILE],
        own_run=True, fresh_start=lambda paths: shutil.rmtree(training_state_path(paths.model_dir), ignore_errors=True),
    ),
    Step("build_index", "index", IndexOutputs, _index_inputs, _index, lambda o: [o.index_dir / INDEX_FILE]),
    Step(
        "evaluate", "evaluation", EvaluateOutputs, _evaluate_inputs, _evaluate,
        lambda o: [o.evaluation_dir / EVALUATION_FILE], own_run=True,
    ),
    Step(
        "register", "registration", Registration, _register_inputs, _register, lambda o: [o.bundle_dir / BUNDLE_FILE],
        own_run=True,
    ),
]  # fmt: skip
STEP_NAMES = [step.name for step in STEPS]
STEP_BEFORE_TRAINING = STEP_NAMES[STEP_NAMES.index(TRAIN_STEP) - 1]  # what a launcher runs before its processes train


def check_step_names(*names: str | None) -> None:
    for name in names:
        if name is not None and name not in STEP_NAMES:
            raise RecsysError(f"unknown pipeline step {name!r}. Fix: one of {', '.join(STEP_NAMES)}")


def given_data(data_dir: Path) -> PreparedData:
    """A prepared directory the caller gives instead of the prepare step's."""
    if not (data_dir / META_FILE).is_file():
        raise RecsysError(f"{data_dir} is not a prepared directory (no {META_FILE}). Fix: `recsys data prepare` it")
    return PreparedData(data_dir, files_sha256(data_dir))


def as_json(outputs: Output | None) -> Any:
    """A step's outputs as JSON: in its recorded state, and as they enter a fingerprint (None: not applicable)."""
    return None if outputs is None else TypeAdapter(type(outputs)).dump_python(outputs, mode="json")


def fingerprint(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def files_sha256(directory: Path) -> str:
    """SHA-256 over the names and bytes of a directory's files (a prepared directory: a few files)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(directory)).encode())
        feed_file(digest, file)
    return digest.hexdigest()
