"""`prepare_data`: the config's raw source -> a prepared directory (`pipelines.data.prepare_step`); a prepared directory
the caller gives (`--data-dir`) stands in for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.data import data_fingerprint, prepare_step
from pipelines.steps.base import ExperimentPaths, Step, files_sha256
from pipelines.steps.outputs import PipelineOutputs, PreparedData
from recsys.data.schema import META_FILE
from recsys.errors import RecsysError


class PrepareDataStep(Step[PreparedData]):
    name = "prepare_data"
    field = "data"
    output = PreparedData

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any]:
        return {"data": data_fingerprint(config.data)}

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> PreparedData:
        data_dir = prepare_step(config.data, paths.data_dir)
        return PreparedData(data_dir, files_sha256(data_dir))

    def produces(self, outputs: PreparedData) -> list[Path]:
        return [outputs.data_dir / META_FILE]

    def given(self, directory: Path) -> PreparedData:
        """A prepared directory the caller gives instead of this step's."""
        if not (directory / META_FILE).is_file():
            raise RecsysError(
                f"{directory} is not a prepared directory (no {META_FILE}). Fix: `recsys data prepare` it"
            )
        return PreparedData(directory, files_sha256(directory))
