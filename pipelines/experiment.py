"""Run one experiment end to end: prepare the data (skipped when up to date), then train and test."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.config import ExperimentConfig
from pipelines.data import prepare_step
from pipelines.train import TrainOutputs, train_step


@dataclass(frozen=True)
class ExperimentPaths:
    """Where an experiment keeps its prepared data and its model directory."""

    data_dir: Path
    model_dir: Path

    @staticmethod
    def under(work_dir: Path, config: ExperimentConfig) -> ExperimentPaths:
        return ExperimentPaths(data_dir=work_dir / "data" / config.name, model_dir=work_dir / "models" / config.name)


def run_experiment(config: ExperimentConfig, paths: ExperimentPaths) -> TrainOutputs:
    """prepare_step(config.data) -> train_step(config); returns the trained model's outputs."""
    data_dir = prepare_step(config.data, paths.data_dir)
    return train_step(config, data_dir, paths.model_dir)
