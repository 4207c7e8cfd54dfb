"""Distillation of a next-item student (SASRec of the serving size) from a teacher (a two-stage ranker, a fusion):
the next-item recipe's packed batches and cross-entropy, mixed with the KL divergence from the teacher's distribution
over its top-K items at every target (`recsys.training.teacher`, computed once before training):

    loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * cross-entropy

both over the teacher's K candidates of the target; the cross-entropy is the next-item recipe's (full softmax, or
the sampled one). The student stays a plain next-item model: saved, indexed and served as any.

Dimension letters: N real positions of a batch, K the teacher's candidates per target, D dim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import torch
from pydantic import Field, PositiveFloat, PositiveInt

from recsys.data.batching import PackedBatch
from recsys.data.prepared import TrainingRows
from recsys.errors import RecsysError
from recsys.training.losses import distillation_kl
from recsys.training.recipes.next_item import NextItemModel, NextItemRecipe, item_rows
from recsys.training.teacher import TeacherTopK

Weight = Annotated[float, Field(ge=0.0, le=1.0)]


@dataclass(frozen=True)
class DistillConfig:
    """An experiment's `distill` section: the teacher, and how much of its distribution the student learns."""

    teacher_dir: Path  # the teacher's model directory (`recsys train` of a two-stage or fusion config)
    top_k: PositiveInt = 50  # the teacher's candidates per target the KL covers
    temperature: PositiveFloat = 1.0  # T: > 1 softens both distributions (more of the teacher's lower ranks)
    alpha: Weight = 0.5  # the KL's weight; 1 - alpha the cross-entropy's (0: plain next-item training)
    teacher_batch_size: PositiveInt = 512  # targets the teacher scores at once (its top-K cache is made once)


@dataclass(frozen=True)
class DistillationRecipe:
    """`NextItemRecipe` batches carrying each target's index, its loss mixed with the KL from `teacher` at it."""

    next_item: NextItemRecipe  # indexing its targets (`create` sets it)
    teacher: TeacherTopK  # for every value of `next_item.trained_rows(rows)`
    temperature: float
    alpha: float

    may_skip_parameters: ClassVar[bool] = False
    loss_compiles_with_model: ClassVar[bool] = False  # the next-item loss, and the teacher scores read per target

    @staticmethod
    def create(next_item: NextItemRecipe, teacher: TeacherTopK, settings: DistillConfig) -> DistillationRecipe:
        indexed = dataclasses.replace(next_item, index_targets=True)
        return DistillationRecipe(indexed, teacher, settings.temperature, settings.alpha)

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[PackedBatch]:
        trained = self.next_item.trained_rows(rows).items.values.numel()
        if trained != len(self.teacher):
            raise RecsysError(
                f"the teacher's top-K cache holds {len(self.teacher):,} training positions, the training rows "
                f"{trained:,}: it was computed for other data. Fix: delete the cache directory (it is recomputed)"
            )
        return self.next_item.batches(rows, generator)

    def loss(self, model: NextItemModel, batch: PackedBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        hidden, targets = self.next_item.hidden_states(model, batch)  # (N, D), (N,)
        cross_entropy = self.next_item.targets_loss(model, hidden, targets, generator)
        assert batch.target_index is not None  # `create` asks the next-item recipe for it
        items, scores = self.teacher.at(batch.target_index.reshape(-1)[batch.flat_real_positions()])  # (N, K) each
        logits = (item_rows(model, items) @ hidden[:, :, None]).squeeze(-1)  # (N, K, D) @ (N, D, 1) -> (N, K)
        kl = distillation_kl(logits, scores, items != 0, self.temperature)
        return self.alpha * kl + (1.0 - self.alpha) * cross_entropy, targets.numel()
