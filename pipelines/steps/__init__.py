"""The pipeline's steps, in order (`STEPS`, the one place it is written; `pipelines.runner` runs them), one module each:
its `Step` (`base.py`) declares its name, inputs, outputs (`outputs.py`), what must exist for a skip and how it runs.

LLM-written item metadata is made with an `enrich` section, and read by the consumers that name its columns
(`recsys.enrich.columns`). Which other steps apply follows from what the model's family reads
(`recsys.models.family.Input`): content embeddings when it reads content, item texts or queries (or a `sid` section
builds semantic IDs from them), training queries beside them when it reads queries, semantic IDs with a `sid`
section, an index when the trained model has item vectors, a registration when tracking is on.
"""

from __future__ import annotations

from typing import Any

from pipelines.steps.base import ExperimentPaths, Step
from pipelines.steps.build_index import BuildIndexStep
from pipelines.steps.build_semantic_ids import BuildSemanticIdsStep
from pipelines.steps.embed_content import EmbedContentStep
from pipelines.steps.enrich_items import EnrichItemsStep
from pipelines.steps.evaluate import EvaluateStep
from pipelines.steps.outputs import PipelineOutputs
from pipelines.steps.prepare_data import PrepareDataStep
from pipelines.steps.register import RegisterStep
from pipelines.steps.train_retriever import TrainRetrieverStep
from recsys.errors import RecsysError

# what callers of the pipeline use; the steps' own names are in their modules
__all__ = [
    "STEPS",
    "STEP_BEFORE_TRAINING",
    "STEP_NAMES",
    "TRAIN_STEP",
    "ExperimentPaths",
    "PipelineOutputs",
    "check_step_names",
]

STEPS: tuple[Step[Any], ...] = (
    PrepareDataStep(),
    EnrichItemsStep(),
    EmbedContentStep(),
    BuildSemanticIdsStep(),
    TrainRetrieverStep(),
    BuildIndexStep(),
    EvaluateStep(),
    RegisterStep(),
)
STEP_NAMES = [step.name for step in STEPS]
TRAIN_STEP = TrainRetrieverStep.name  # what `recsys train` runs until, and the launchers start on several processes
STEP_BEFORE_TRAINING = STEP_NAMES[STEP_NAMES.index(TRAIN_STEP) - 1]  # what a launcher runs before its processes train


def check_step_names(*names: str | None) -> None:
    for name in names:
        if name is not None and name not in STEP_NAMES:
            raise RecsysError(f"unknown pipeline step {name!r}. Fix: one of {', '.join(STEP_NAMES)}")
