"""Training recipes: how a model family turns training rows into batches and a batch into a loss, and the family's
own training settings (an experiment's `model.training`).

The trainer (`recsys.training.trainer.fit`) owns epochs, validation, early stopping and checkpoints; a recipe owns
what differs between model families. A family names its training (`ModelFamily.training`), a key of `TRAININGS`:
the settings type its `model.training` is validated against and the factory of its recipe (none for a family fitted
without an epoch loop). `register_training` adds one (a family defined outside the platform, with its own recipe);
`recipe_for` builds the recipe of a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import torch

from recsys.data.prepared import SequenceData, TrainingData, TrainingRows
from recsys.errors import ConfigError
from recsys.models.family import Model
from recsys.models.registry import family_of
from recsys.training.recipes.distillation import DistillationRecipe, DistillConfig
from recsys.training.recipes.next_item import NextItemModel, NextItemRecipe, NextItemTraining
from recsys.training.recipes.pairs import (
    GenerativeModel,
    GenerativeRecipe,
    GenerativeTraining,
    PackedRowsTwoTower,
    TwoTowerModel,
    TwoTowerRecipe,
    TwoTowerTraining,
)
from recsys.training.recipes.queries import QUERIES_FILE, QueryBank, QueryModel, QueryRecipe, QueryTraining
from recsys.training.recipes.ranker import RankerModel, RankerRecipe, RankerTraining


@dataclass(frozen=True)
class NotTrained:
    """The settings of models that no recipe trains: popularity (item counts), fusion (made of trained models)."""


@runtime_checkable
class Recipe(Protocol):
    # whether a step may leave parameters out of the loss (data-parallel training must then look for them)
    may_skip_parameters: ClassVar[bool]
    # whether the loss is device work alone (no draws from a host generator, no host reads, no Python per row), so
    # that `train.hardware.compile` traces it into one graph with the model's forward (`DataParallelLoss.compile`);
    # else the model's forward compiles alone and the loss runs eagerly
    loss_compiles_with_model: ClassVar[bool]

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[Any]:
        """Shuffled batches of `rows` (each with a `.to(device)`): one epoch's, or one shuffle buffer's of it."""
        ...

    def loss(self, model: Any, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """(mean loss over the batch's targets, number of targets). Each recipe types `model` by the protocol it
        trains (`NextItemModel`, ...; its factory checks the model meets it), so here it is any model."""
        ...


@dataclass(frozen=True)
class RecipeInputs:
    """What a recipe reads besides the model and the data; the pipeline gives what the family reads.

    Args:
        holdout_retriever: a ranker's first stage trained without each user's last `RankerTraining.holdout_items`
            training items (`Input.HOLDOUT_RETRIEVER`).
        query_bank: the items' training queries (`Input.QUERIES`).
        extra_holdout_retrievers: a ranker's further first stages, each trained without the same last items
            (`Input.EXTRA_HOLDOUT_RETRIEVERS`).
    """

    holdout_retriever: Model[Any] | None = None
    query_bank: QueryBank | None = None
    extra_holdout_retrievers: tuple[Model[Any], ...] = ()


SettingsT = TypeVar("SettingsT")
# (the model, the data, the batch size, the family's settings, the recipe's inputs) -> its recipe
RecipeFactory = Callable[[Model[Any], TrainingData, int, SettingsT, RecipeInputs], Recipe]


@dataclass(frozen=True)
class Training(Generic[SettingsT]):
    """How a family trains: its `model.training` settings and its recipe (None: fitted without an epoch loop, or
    not trained at all)."""

    settings: type[SettingsT]
    recipe: RecipeFactory[SettingsT] | None = None


def untrainable(model: Model[Any], protocol: type, training: str) -> ConfigError:
    """The error for a model that recipe `training` cannot train: it lacks the methods of `protocol`."""
    return ConfigError(
        f"{type(model).__name__} is trained by the {training!r} recipe, which needs the methods of "
        f"{protocol.__name__} ({protocol.__module__}). Fix: give the model those methods, or its family another "
        "training"
    )


def _next_item(model: Model[Any], data: TrainingData, batch: int, s: NextItemTraining, _: RecipeInputs) -> Recipe:
    if not isinstance(model, NextItemModel):
        raise untrainable(model, NextItemModel, "next_item")
    return NextItemRecipe.create(model, data, batch, s)


def _queries(model: Model[Any], data: TrainingData, batch: int, s: QueryTraining, inputs: RecipeInputs) -> Recipe:
    if not isinstance(model, QueryModel):
        raise untrainable(model, QueryModel, "queries")
    return QueryRecipe.create(model, data, batch, s, inputs.query_bank)


def _generative(model: Model[Any], _: TrainingData, batch: int, s: GenerativeTraining, __: RecipeInputs) -> Recipe:
    if not isinstance(model, GenerativeModel):
        raise untrainable(model, GenerativeModel, "generative")
    return GenerativeRecipe(model.max_history, batch, s.label_smoothing, s.by_length, s.temperature, s.holdout_last,
                            s.length_buckets)  # fmt: skip


def _two_tower(model: Model[Any], data: TrainingData, batch: int, s: TwoTowerTraining, _: RecipeInputs) -> Recipe:
    if s.objective == "next_item":
        if not isinstance(model, PackedRowsTwoTower):
            raise untrainable(model, PackedRowsTwoTower, "two_tower")
        model.check_packed_rows()
        return NextItemRecipe.create(model, data, batch, NextItemTraining(num_negatives=s.num_negatives))
    if not isinstance(model, TwoTowerModel):
        raise untrainable(model, TwoTowerModel, "two_tower")
    return TwoTowerRecipe.create(model, data, batch, s)


def _ranker(model: Model[Any], data: TrainingData, batch: int, s: RankerTraining, inputs: RecipeInputs) -> Recipe:
    if not isinstance(data, SequenceData):
        raise ConfigError("a ranker trains on data in memory (its labels). Fix: remove train.stream_parts")
    if not isinstance(model, RankerModel):
        raise untrainable(model, RankerModel, "ranker")
    return RankerRecipe.create(model, data, batch, s, inputs.holdout_retriever, inputs.extra_holdout_retrievers)


TRAININGS: dict[str, Training[Any]] = {
    "next_item": Training(NextItemTraining, _next_item),
    "queries": Training(QueryTraining, _queries),
    "generative": Training(GenerativeTraining, _generative),
    "two_tower": Training(TwoTowerTraining, _two_tower),
    "ranker": Training(RankerTraining, _ranker),
    "counts": Training(NotTrained),  # fitted on item counts (`recsys.training.capabilities.FitsItemCounts`)
    "frozen": Training(NotTrained),  # made of trained models
}


def register_training(name: str, training: Training[Any]) -> None:
    """Make `training` the one a family names as `name`; a taken name is an error."""
    known = TRAININGS.get(name)
    if known is not None and known != training:
        raise ConfigError(f"training {name!r} is registered already. Fix: give yours another name")
    TRAININGS[name] = training


def training_named(name: str) -> Training[Any]:
    if name not in TRAININGS:
        raise ConfigError(
            f"training {name!r} (a model family's) is not registered. Fix: one of {', '.join(sorted(TRAININGS))}, "
            "or `register_training` it"
        )
    return TRAININGS[name]


def recipe_for(
    model: Model[Any],
    data: TrainingData,
    batch_size: int,
    settings: object | None = None,
    inputs: RecipeInputs | None = None,
) -> Recipe:
    """The recipe that trains `model` as its family trains (`batch_size`: packed rows for next-item models, pairs for
    the others) with `settings` (its family's `model.training`; None: their defaults) on `inputs`."""
    name = family_of(model).training
    training = training_named(name)
    settings = training.settings() if settings is None else settings
    if not isinstance(settings, training.settings):
        raise TypeError(
            f"{type(model).__name__} trains with {training.settings.__name__}, not {type(settings).__name__}"
        )
    if training.recipe is None:
        raise ConfigError(f"{type(model).__name__} is not trained by a recipe (its family's training is {name!r})")
    return training.recipe(model, data, batch_size, settings, inputs or RecipeInputs())


__all__ = [
    "QUERIES_FILE",
    "TRAININGS",
    "DistillConfig",
    "DistillationRecipe",
    "GenerativeRecipe",
    "GenerativeTraining",
    "NextItemRecipe",
    "NextItemTraining",
    "NotTrained",
    "QueryBank",
    "QueryRecipe",
    "QueryTraining",
    "RankerRecipe",
    "RankerTraining",
    "Recipe",
    "RecipeInputs",
    "Training",
    "TwoTowerRecipe",
    "TwoTowerTraining",
    "recipe_for",
    "register_training",
    "training_named",
]
