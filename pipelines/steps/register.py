"""`register`: the model bundle -> a new version of the registered model, and the champion gate
(`pipelines.registry.register_bundle`); with tracking on (the registry is MLflow's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.registry import GateRule, register_bundle
from pipelines.steps.base import ExperimentPaths, Step, as_json
from pipelines.steps.outputs import PipelineOutputs, Registration
from recsys.artifacts.bundle import BUNDLE_FILE, Bundle


class RegisterStep(Step[Registration]):
    name = "register"
    field = "registration"
    output = Registration
    opens_own_run = True

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
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

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> Registration:
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

    def produces(self, outputs: Registration) -> list[Path]:
        return [outputs.bundle_dir / BUNDLE_FILE]
