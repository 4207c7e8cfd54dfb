"""`train_retriever`: train the config's model, pick the best epoch on validation, test (`pipelines.train.train_step`).
Every process of a distributed run takes part in it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.distill import TEACHER_KEY
from pipelines.steps.base import HOW_IT_RUNS, ExperimentPaths, Step, as_json
from pipelines.steps.outputs import PipelineOutputs
from pipelines.train import TrainOutputs, train_step, training_state_path
from recsys.artifacts.model_dir import MODEL_FILE, check_model_dir, model_sha256

# training options added after work dirs were first fingerprinted, left out of the inputs at the value that trains as
# before they came: a work dir trained then stays current until one is set
ADDED_WITH_NEUTRAL_DEFAULT = {("optimization", "max_grad_norm"): None}


class TrainRetrieverStep(Step[TrainOutputs]):
    name = "train_retriever"
    field = "model"
    output = TrainOutputs
    opens_own_run = True
    every_process = True

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any]:
        student = {"distill"} if config.distill is not None else set()  # (absent: the fingerprints of before it came)
        # the intervals are the evaluate step's: they do not change what training makes
        exclude = {**HOW_IT_RUNS, "eval": HOW_IT_RUNS["eval"] | {"uncertainty"}}
        sections = config.model_dump(mode="json", include={"model", "train", "eval", *student}, exclude=exclude)
        for (group, key), neutral in ADDED_WITH_NEUTRAL_DEFAULT.items():
            if sections["train"][group][key] == neutral:
                del sections["train"][group][key]
        model = config.model
        upstream = {
            entry: model_sha256(path, model.upstream_key(entry)) for entry, path in model.upstream_dirs().items()
        }
        if config.distill is not None:
            upstream["teacher"] = model_sha256(config.distill.teacher_dir, TEACHER_KEY)
        features = {"sids": as_json(done.semantic_ids), "content": as_json(done.content)}
        data = {"domain": config.data.domain, "data": as_json(done.data)}
        return {**sections, **data, **features, "upstream": upstream}

    def check(self, config: ExperimentConfig) -> None:
        for entry, path in config.model.upstream_dirs().items():
            check_model_dir(path, config.model.upstream_key(entry))
        if config.distill is not None:
            check_model_dir(config.distill.teacher_dir, TEACHER_KEY)

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> TrainOutputs:
        assert done.data is not None
        return train_step(config, done.data.data_dir, paths.model_dir, done.features())

    def produces(self, outputs: TrainOutputs) -> list[Path]:
        return [outputs.model_dir / MODEL_FILE]

    def fresh_start(self, paths: ExperimentPaths) -> None:
        shutil.rmtree(training_state_path(paths.model_dir), ignore_errors=True)
