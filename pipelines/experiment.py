"""Run one experiment end to end: prepare the data, build semantic IDs if the config asks, train, test.

Every step is skipped when its inputs did not change (see each step), so re-running resumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.config import ExperimentConfig
from pipelines.content import embed_content_step
from pipelines.data import prepare_step
from pipelines.semantic_ids import build_semantic_ids_step
from pipelines.train import TrainOutputs, train_step


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
        )


def run_experiment(config: ExperimentConfig, paths: ExperimentPaths, data_dir: Path | None = None) -> TrainOutputs:
    """prepare_step -> [embed_content_step -> build_semantic_ids_step] -> train_step; returns the model's outputs.

    Args:
        config: the experiment.
        paths: where its outputs go.
        data_dir: an already prepared directory to use instead of preparing `config.data`.
    """
    data_dir = data_dir or prepare_step(config.data, paths.data_dir)
    if config.sid is not None:
        embeddings = embed_content_step(config.sid.content, data_dir, paths.content_dir, paths.cache_dir)
        sid_path = build_semantic_ids_step(config.sid, data_dir, embeddings, paths.sid_dir)
        config = with_item_features(config, str(sid_path), str(embeddings))
    return train_step(config, data_dir, paths.model_dir)


def with_item_features(config: ExperimentConfig, semantic_ids: str, content_embeddings: str) -> ExperimentConfig:
    """`config` whose model params name the `sid` section's outputs (models that do not read them ignore them)."""
    params = {**config.model.params, "semantic_ids": semantic_ids, "content_embeddings": content_embeddings}
    return config.model_copy(update={"model": config.model.model_copy(update={"params": params})})
