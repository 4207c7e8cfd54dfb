"""What every step is: the `Step` interface the runner calls, the experiment's paths, and how inputs are fingerprinted.

A step declares its name, the `PipelineOutputs` field it fills and its outputs' type, and how it runs (`Step`'s class
attributes); it gives its inputs as JSON (None: it does not apply), does its work (written atomically), and names what
must still exist for a skip. The runner (`pipelines.runner`) knows steps by this interface alone.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import TypeAdapter

from pipelines.config import ExperimentConfig
from pipelines.steps.outputs import Output, PipelineOutputs
from recsys.runtime.digest import feed_file
from recsys.runtime.names import child

T = TypeVar("T")

# budgets bound a run, processes spread it and a compile cache speeds it, none sets what it learns: changing one
# leaves a finished step current
HOW_IT_RUNS: dict[str, Any] = {
    "train": {"hardware": {"max_memory_gb", "compile_cache"}, "distributed": True},
    "eval": {"max_seconds", "max_memory_gb"},
    "distill": {"teacher_batch_size"},
}


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
        """The paths of `config`'s experiment under `work_dir`: each directly under its folder (`child` checks the
        name again: the config checked it when loaded, this holds for a config built otherwise too)."""
        return ExperimentPaths(
            data_dir=child(work_dir / "data", config.name),
            metadata_dir=child(work_dir / "metadata", config.name),
            content_dir=child(work_dir / "content", config.name),
            sid_dir=child(work_dir / "sids", config.name),
            model_dir=child(work_dir / "models", config.name),
            cache_dir=work_dir / "cache" / "embeddings",
            enrich_cache_dir=work_dir / "cache" / "enrich",
            index_dir=child(work_dir / "indexes", config.name),
            bundle_dir=child(work_dir / "bundles", config.name),
            evaluation_dir=child(work_dir / "evaluations", config.name),
            pipeline_dir=child(work_dir / "pipelines", config.name),
        )

    def outputs(self) -> list[Path]:
        """The steps' output directories: this experiment's alone (the embeddings cache is shared, so not one)."""
        return [self.data_dir, self.metadata_dir, self.content_dir, self.sid_dir, self.model_dir, self.index_dir,
                self.bundle_dir, self.evaluation_dir]  # fmt: skip


class Step(ABC, Generic[T]):
    """One step of the pipeline, producing outputs of type T (a frozen dataclass with a `summary()`)."""

    name: ClassVar[str]  # what `--step` and the Airflow tasks call it
    field: ClassVar[str]  # the PipelineOutputs field its outputs fill
    output: ClassVar[type]  # T: how its outputs are recorded in the state file and read back
    opens_own_run: ClassVar[bool] = False  # it opens its own nested MLflow run; the runner opens one for the others
    # every process of a distributed run runs it; the others follow the steps before it (the first process runs them)
    every_process: ClassVar[bool] = False

    @abstractmethod
    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
        """What its outputs are made from, as JSON (the runner fingerprints it); None: the step does not apply."""

    @abstractmethod
    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> T:
        """Do the step's work, written atomically under `paths`, from the outputs of the steps before it."""

    @abstractmethod
    def produces(self, outputs: T) -> list[Path]:
        """What must still exist for the step to be skipped when its inputs did not change."""

    def check(self, config: ExperimentConfig) -> None:
        """RecsysError naming what the step will need that is not there and cannot be made by the steps before it
        (a trained model it is built on): checked for every step a run will run, before the first one, so that a run
        does not prepare data for minutes to fail at its last step. Nothing by default."""

    def given(self, directory: Path) -> T | None:
        """The outputs a directory the caller gives (`run_pipeline(data_dir=)`) stands for, instead of running the
        step; None: the step's outputs cannot be given."""
        return None

    def fresh_start(self, paths: ExperimentPaths) -> None:
        """Drop what the step would resume from, before it runs from scratch (`run_pipeline(rerun=)`)."""


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
