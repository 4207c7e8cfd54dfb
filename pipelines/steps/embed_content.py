"""`embed_content`: the items' text -> content embeddings (`pipelines.content.embed_content_step`), and for a model that
reads queries its training queries; when the model reads content, item texts or queries, or a `sid` section builds
semantic IDs from text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.content import embed_content_step, embed_training_queries
from pipelines.semantic_ids import reads_text
from pipelines.steps.base import ExperimentPaths, Step, as_json
from pipelines.steps.outputs import ContentEmbeddings, PipelineOutputs
from recsys.errors import ConfigError
from recsys.models.family import CONTENT_INPUTS, Input
from recsys.training.recipes import QueryTraining


class EmbedContentStep(Step[ContentEmbeddings]):
    name = "embed_content"
    field = "content"
    output = ContentEmbeddings

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
        if (config.sid is None or not reads_text(config.sid)) and not config.model.reads() & CONTENT_INPUTS:
            return None  # nothing reads the items' text
        content = config.model_dump(mode="json", include={"content"})["content"]
        inputs = {"content": content, "data": as_json(done.data)}
        if done.metadata is not None:
            inputs["metadata"] = as_json(done.metadata)
        queries = training_queries(config)
        if queries is None:
            return inputs
        return {**inputs, "training_queries": {"per_item": queries.queries_per_item, "seed": queries.query_seed}}

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> ContentEmbeddings:
        assert done.data is not None
        data_dir, content = done.data.data_dir, config.content
        metadata = None if done.metadata is None else done.metadata.path
        path = embed_content_step(content, data_dir, paths.content_dir, paths.cache_dir, metadata)
        settings = training_queries(config)
        if settings is None:
            return ContentEmbeddings(path, encoder=content.model)
        queries = embed_training_queries(content, settings, data_dir, paths.content_dir, paths.cache_dir, metadata)
        return ContentEmbeddings(path, queries, content.model)

    def produces(self, outputs: ContentEmbeddings) -> list[Path]:
        return [outputs.path, *([] if outputs.queries is None else [outputs.queries])]


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
