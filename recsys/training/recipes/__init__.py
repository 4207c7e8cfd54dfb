"""Training recipes: how a model family turns training rows into batches and a batch into a loss, and the family's
own training settings (an experiment's `model.training`).

The trainer (`recsys.training.trainer.fit`) owns epochs, validation, early stopping and checkpoints; a recipe owns
what differs between model families. `recipe_for` builds the recipe of a model from its family's settings; the
settings' type says the family (`TRAINING_SETTINGS`, keyed by `recsys.models.TrainingFamily`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from recsys.data.prepared import SequenceData, TrainingData, TrainingRows
from recsys.errors import ConfigError
from recsys.inference import Scorer
from recsys.models import TrainingFamily
from recsys.training.recipes.distillation import DistillationRecipe, DistillConfig
from recsys.training.recipes.next_item import NextItemRecipe, NextItemTraining
from recsys.training.recipes.pairs import GenerativeRecipe, GenerativeTraining, TwoTowerRecipe, TwoTowerTraining
from recsys.training.recipes.query_aware import QUERIES_FILE, QueryAwareRecipe, QueryAwareTraining, QueryBank
from recsys.training.recipes.ranker import RankerRecipe, RankerTraining


@dataclass(frozen=True)
class NotTrained:
    """The settings of models that no recipe trains: popularity (item counts), fusion (made of trained models)."""


TrainingSettings = (
    NextItemTraining | QueryAwareTraining | GenerativeTraining | TwoTowerTraining | RankerTraining | NotTrained
)
TRAINING_SETTINGS: dict[TrainingFamily, type[TrainingSettings]] = {
    "next_item": NextItemTraining,
    "query_aware": QueryAwareTraining,
    "generative": GenerativeTraining,
    "two_tower": TwoTowerTraining,
    "ranker": RankerTraining,
    "counts": NotTrained,
    "frozen": NotTrained,
}


class Recipe(Protocol):
    # whether a step may leave parameters out of the loss (data-parallel training must then look for them)
    may_skip_parameters: ClassVar[bool]

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[Any]:
        """Shuffled batches of `rows` (each with a `.to(device)`): one epoch's, or one shuffle buffer's of it."""
        ...

    def loss(self, model: Any, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """(mean loss over the batch's targets, number of targets)."""
        ...


def recipe_for(
    model: nn.Module,
    data: TrainingData,
    batch_size: int,
    settings: TrainingSettings,
    holdout_retriever: Scorer | None = None,
    query_bank: QueryBank | None = None,
) -> Recipe:
    """The recipe that trains `model` with its family's `settings` (`batch_size`: packed rows for next-item models,
    pairs for the others); a ranker's `holdout_retriever` is its first stage trained without each user's last
    `RankerTraining.holdout_items` training items; a query-aware model's `query_bank` its items' training queries."""
    match settings:
        case QueryAwareTraining():  # before NextItemTraining, which it extends
            return QueryAwareRecipe.create(model, data, batch_size, settings, query_bank)  # type: ignore[arg-type]
        case NextItemTraining():
            return NextItemRecipe.create(model, data, batch_size, settings)
        case GenerativeTraining():
            return GenerativeRecipe(model.max_history, batch_size, settings.label_smoothing)  # type: ignore[arg-type]
        case TwoTowerTraining():
            return TwoTowerRecipe.create(model, data, batch_size, settings)
        case RankerTraining():
            if not isinstance(data, SequenceData):
                raise ConfigError("a ranker trains on data in memory (its labels). Fix: remove data.stream_parts")
            return RankerRecipe.create(model, data, batch_size, settings, holdout_retriever)
    raise TypeError(f"{type(model).__name__} is not trained by a recipe ({type(settings).__name__})")


__all__ = [
    "QUERIES_FILE",
    "TRAINING_SETTINGS",
    "DistillConfig",
    "DistillationRecipe",
    "GenerativeRecipe",
    "GenerativeTraining",
    "NextItemRecipe",
    "NextItemTraining",
    "NotTrained",
    "QueryAwareRecipe",
    "QueryAwareTraining",
    "QueryBank",
    "RankerRecipe",
    "RankerTraining",
    "Recipe",
    "TrainingSettings",
    "TwoTowerRecipe",
    "TwoTowerTraining",
    "recipe_for",
]
