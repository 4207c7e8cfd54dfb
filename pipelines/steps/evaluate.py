"""`evaluate`: the trained model on the test split once, sliced, and its dashboard
(`pipelines.evaluate.evaluate_step`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.evaluate import EvaluateOutputs, evaluate_step
from pipelines.steps.base import HOW_IT_RUNS, ExperimentPaths, Step, as_json
from pipelines.steps.outputs import PipelineOutputs
from recsys.artifacts.evaluation_dir import EVALUATION_FILE
from recsys.artifacts.model_dir import file_sha256
from recsys.models.family import Input


class EvaluateStep(Step[EvaluateOutputs]):
    name = "evaluate"
    field = "evaluation"
    output = EvaluateOutputs
    opens_own_run = True

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any]:
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

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> EvaluateOutputs:
        assert done.model is not None
        return evaluate_step(config, done.model, paths.evaluation_dir, done.features(), paths.cache_dir)

    def produces(self, outputs: EvaluateOutputs) -> list[Path]:
        return [outputs.evaluation_dir / EVALUATION_FILE]


def _digest_or_none(path: Path) -> str | None:
    return file_sha256(path) if path.is_file() else None


def _search_content(config: ExperimentConfig, done: PipelineOutputs) -> dict[str, str] | None:
    """The digests of the content a model that reads queries has its search slices made from (its embeddings: the
    neighbour-mix level; its training queries: what test queries differ from); None for any other model."""
    if Input.QUERIES not in config.model.reads() or done.content is None or done.content.queries is None:
        return None
    return {"content_embeddings": file_sha256(done.content.path), "training_queries": file_sha256(done.content.queries)}
