"""Training recipes: how a model family turns training sequences into batches and a batch into a loss.

The trainer (`recsys.training.trainer.fit`) owns epochs, validation, early stopping and checkpoints; a
recipe owns what differs between model families. `recipe_for` picks the recipe of a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from recsys.data.batching import HistoryBatch, PackedBatch, history_target_batches, packed_next_item_batches
from recsys.data.jagged import Jagged
from recsys.data.prepared import SequenceData
from recsys.models.generative import GenerativeRetriever
from recsys.models.ranker import TwoStageRanker
from recsys.models.sasrec import SASRec
from recsys.training.losses import full_softmax_loss, sampled_softmax_loss


class Recipe(Protocol):
    def batches(self, sequences: Jagged, generator: torch.Generator) -> list[Any]:
        """One epoch of batches (each with a `.to(device)`)."""
        ...

    def loss(self, model: nn.Module, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """(mean loss over the batch's targets, number of targets)."""
        ...


@dataclass(frozen=True)
class NextItemRecipe:
    """SASRec-style: packed sequences, the hidden state at every position predicts the next item.

    Args:
        max_len: the model's max_len (row width).
        rows_per_batch: packed rows per batch.
        excluded: (V+1,) bool, items that are never candidates in training (cold-start items), or None.
        sampling_probs: (V+1,) negative-sampling distribution for sampled softmax; None = full softmax.
        num_negatives: negatives per batch (sampled softmax only).
    """

    max_len: int
    rows_per_batch: int
    excluded: torch.Tensor | None = None  # (V+1,) bool: items kept out of the softmax (cold-start items)
    sampling_probs: torch.Tensor | None = None
    num_negatives: int = 0

    def batches(self, sequences: Jagged, generator: torch.Generator) -> list[PackedBatch]:
        return list(packed_next_item_batches(sequences, self.max_len, self.rows_per_batch, generator))

    def loss(self, model: nn.Module, batch: PackedBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        assert isinstance(model, SASRec)
        real = batch.targets != 0  # (B, L)
        hidden = model(batch.inputs, batch.segments, batch.positions)[real]  # (N, D)
        targets = batch.targets[real]
        if self.sampling_probs is None:
            excluded = None if self.excluded is None else self.excluded.to(hidden.device)
            return full_softmax_loss(hidden, model.item_embeddings(), targets, excluded), targets.numel()
        loss = sampled_softmax_loss(
            hidden, model.item_embeddings(), targets, self.sampling_probs, self.num_negatives, generator
        )
        return loss, targets.numel()


@dataclass(frozen=True)
class GenerativeRecipe:
    """TIGER-style: every (history, next item) pair; cross-entropy on each level of the next item's code."""

    max_history: int
    batch_size: int
    label_smoothing: float = 0.0

    def batches(self, sequences: Jagged, generator: torch.Generator) -> list[HistoryBatch]:
        return list(history_target_batches(sequences, self.max_history, self.batch_size, generator))

    def loss(self, model: nn.Module, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        assert isinstance(model, GenerativeRetriever)
        codes = model.codes[batch.targets]  # (B, T)
        logits = model(batch.histories, batch.targets, batch.users)
        per_level = [
            F.cross_entropy(lg.float(), codes[:, t], label_smoothing=self.label_smoothing)
            for t, lg in enumerate(logits)
        ]
        loss = torch.stack(per_level).mean()
        return loss, batch.targets.numel()


@dataclass(frozen=True)
class RankerRecipe:
    """Second stage: every (history, next item) pair; softmax over the retriever's top candidates (the first
    `train_candidates` of its top-C) with the target forced in (it replaces the last candidate when the
    retriever missed it): hard negatives only. The MoE head's load loss is added when the head has one."""

    max_history: int
    batch_size: int

    def batches(self, sequences: Jagged, generator: torch.Generator) -> list[HistoryBatch]:
        return list(history_target_batches(sequences, self.max_history, self.batch_size, generator))

    def loss(self, model: nn.Module, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        assert isinstance(model, TwoStageRanker)
        top = model.candidates(batch.histories, batch.users)
        width = model.config.train_candidates or top.indices.shape[1]
        candidates, retrieval = top.indices[:, :width].clone(), top.values[:, :width].clone()  # (B, C')
        hit = candidates == batch.targets[:, None]
        missed = ~hit.any(dim=1)
        candidates[missed, -1] = batch.targets[missed]
        retrieval[missed, -1] = retrieval[missed].min(dim=1).values  # the retriever ranked it below its top-C
        labels = (candidates == batch.targets[:, None]).float().argmax(dim=1)
        logits = model.ranker(batch.histories, candidates, retrieval)[0].float()  # (B, C), task 0
        return F.cross_entropy(logits, labels) + model.ranker.aux_loss, batch.targets.numel()


def recipe_for(
    model: nn.Module,
    data: SequenceData,
    batch_size: int,
    loss: str = "full_softmax",
    num_negatives: int = 0,
    label_smoothing: float = 0.0,
) -> Recipe:
    """The recipe that trains `model`; `loss` and `num_negatives` apply to next-item models, `label_smoothing`
    to the generative one."""
    if isinstance(model, SASRec):
        probs = _sampling_probs(data) if loss == "sampled_softmax" else None
        excluded = data.cold_mask if bool(data.cold_mask.any()) else None
        return NextItemRecipe(model.config.max_len, batch_size, excluded, probs, num_negatives)
    if isinstance(model, GenerativeRetriever):
        return GenerativeRecipe(model.config.max_history, batch_size, label_smoothing)
    if isinstance(model, TwoStageRanker):
        return RankerRecipe(model.config.max_history, batch_size)
    raise TypeError(f"no training recipe for {type(model).__name__}")


def _sampling_probs(data: SequenceData) -> torch.Tensor:
    """Training popularity (+1 smoothing so every item can be drawn), 0 at the padding index."""
    counts = data.item_counts().double() + 1.0
    counts[0] = 0.0
    counts[data.cold_mask] = 0.0  # cold-start items do not exist at training time
    return (counts / counts.sum()).float()
