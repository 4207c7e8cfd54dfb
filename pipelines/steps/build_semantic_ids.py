"""`build_semantic_ids`: content embeddings and / or collaborative vectors -> RQ-VAE / RQ-KMeans codes
(`pipelines.semantic_ids.build_semantic_ids_step`); for a config with a `sid` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.semantic_ids import build_semantic_ids_step, reads_text
from pipelines.steps.base import ExperimentPaths, Step, as_json
from pipelines.steps.outputs import PipelineOutputs, SemanticIds
from recsys.semantic_ids.codes import SEMANTIC_IDS_FILE


class BuildSemanticIdsStep(Step[SemanticIds]):
    name = "build_semantic_ids"
    field = "semantic_ids"
    output = SemanticIds

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
        if config.sid is None:
            return None
        return {"sid": config.sid.model_dump(mode="json"), "data": as_json(done.data), "content": as_json(done.content)}

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> SemanticIds:
        assert config.sid is not None and done.data is not None
        assert done.content is not None or not reads_text(config.sid), (
            "the content step runs when the vectors read text"
        )
        embeddings = None if done.content is None else done.content.path
        return SemanticIds(
            build_semantic_ids_step(config.sid, config.content, done.data.data_dir, embeddings, paths.sid_dir)
        )

    def produces(self, outputs: SemanticIds) -> list[Path]:
        return [outputs.path]

    def fresh_start(self, paths: ExperimentPaths) -> None:
        (paths.sid_dir / SEMANTIC_IDS_FILE).unlink(missing_ok=True)
