"""`build_index`: the trained model's item vectors -> a FAISS index, with its recall against exact search
(`pipelines.index.build_index_step`); for a model with item vectors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.steps.base import ExperimentPaths, Step
from pipelines.steps.outputs import IndexOutputs, PipelineOutputs
from recsys.retrieval.config import INDEX_FILE


class BuildIndexStep(Step[IndexOutputs]):
    name = "build_index"
    field = "index"
    output = IndexOutputs

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
        assert done.model is not None
        if not done.model.item_vectors:
            return None
        return {"index": dataclasses.asdict(config.pipeline.index), "model_sha256": done.model.model_sha256}

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> IndexOutputs:
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

    def produces(self, outputs: IndexOutputs) -> list[Path]:
        return [outputs.index_dir / INDEX_FILE]
