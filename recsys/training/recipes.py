"""Training recipes: how a model family turns training sequences into batches and a batch into a loss.

The trainer (`recsys.training.trainer.fit`) owns epochs, validation, early stopping and checkpoints; a
recipe owns what differs between model families. `recipe_for` picks the recipe of a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from recsys.data.batching import (
    HistoryBatch,
    PackedBatch,
    held_out_batches,
    history_target_batches,
    packed_next_item_batches,
)
from recsys.data.jagged import Jagged
from recsys.data.prepared import SequenceData
from recsys.models.domain_adapters import DomainAdaptedRetriever
from recsys.models.generative import GenerativeRetriever
from recsys.models.hstu import HSTU
from recsys.models.ranker import TwoStageRanker
from recsys.models.sasrec import SASRec
from recsys.models.two_tower import TwoTower
from recsys.training.losses import full_softmax_loss, sampled_softmax_loss


class Recipe(Protocol):
    def batches(self, sequences: Jagged, generator: torch.Generator, timestamps: Jagged | None = None) -> list[Any]:
        """One epoch of batches (each with a `.to(device)`); `timestamps` (aligned with `sequences`) are given
        for models that read them."""
        ...

    def loss(self, model: nn.Module, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """(mean loss over the batch's targets, number of targets)."""
        ...


@dataclass(frozen=True)
class NextItemRecipe:
    """SASRec, HSTU and domain-adapted SASRec: packed sequences, the hidden state at every position predicts the
    next item.

    Args:
        max_len: the model's max_len (row width).
        rows_per_batch: packed rows per batch.
        excluded: (V+1,) bool, items that are never candidates in training (cold-start items), or None.
        sampling_probs: (V+1,) negative-sampling distribution for sampled softmax; None = full softmax.
        num_negatives: negatives per batch (sampled softmax only).
        item_domains: (V+1,) every item's domain index: each target's full softmax covers its domain's items only.
    """

    max_len: int
    rows_per_batch: int
    excluded: torch.Tensor | None = None  # (V+1,) bool: items kept out of the softmax (cold-start items)
    sampling_probs: torch.Tensor | None = None
    num_negatives: int = 0
    item_domains: torch.Tensor | None = None  # (V+1,) full softmax over each target's domain only; None = all

    def batches(
        self, sequences: Jagged, generator: torch.Generator, timestamps: Jagged | None = None
    ) -> list[PackedBatch]:
        return list(packed_next_item_batches(sequences, self.max_len, self.rows_per_batch, generator, timestamps))

    def loss(self, model: nn.Module, batch: PackedBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        assert isinstance(model, SASRec | HSTU | DomainAdaptedRetriever)
        real = batch.targets != 0  # (B, L)
        if isinstance(model, HSTU):
            times = batch.timestamps, batch.next_timestamps
            hidden = model(batch.inputs, batch.segments, batch.positions, *times)[real]  # (N, D)
        else:
            hidden = model(batch.inputs, batch.segments, batch.positions)[real]
        targets = batch.targets[real]
        if self.sampling_probs is None:
            excluded = None if self.excluded is None else self.excluded.to(hidden.device)
            if self.item_domains is not None:  # (N, V+1): other domains' items are out of each target's softmax
                domains = self.item_domains.to(hidden.device)
                other = domains[None, :] != domains[targets][:, None]
                excluded = other if excluded is None else other | excluded[None, :]
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

    def batches(
        self, sequences: Jagged, generator: torch.Generator, timestamps: Jagged | None = None
    ) -> list[HistoryBatch]:
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
class TwoTowerRecipe:
    """Two-tower: every (history, next item) pair; softmax over the batch's targets (in-batch negatives) and
    `num_negatives` uniformly drawn items (mixed negative sampling, Yang et al. 2020). Each candidate's logit is
    corrected by the log of how often it is expected in the sample (logQ: batch size x its share of training
    targets for in-batch ones, num_negatives / V for random ones), so popular items are not over-penalised.
    Other rows whose target is the row's own target are masked out (accidental hits)."""

    max_history: int
    batch_size: int
    target_log_probs: torch.Tensor  # (V+1,) log share of each item among training targets
    num_negatives: int

    def batches(
        self, sequences: Jagged, generator: torch.Generator, timestamps: Jagged | None = None
    ) -> list[HistoryBatch]:
        return list(history_target_batches(sequences, self.max_history, self.batch_size, generator))

    def loss(self, model: nn.Module, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        assert isinstance(model, TwoTower)
        targets, device = batch.targets, batch.targets.device
        B, V, R = targets.numel(), model.config.num_items, self.num_negatives
        random = torch.randint(1, V + 1, (R,), generator=generator).to(device)
        candidates = torch.cat([targets, random])  # (B + R,)
        users = model.encode_queries(batch.histories, batch.users)  # (B, D)
        logits = users @ model.encode_items(candidates).T / model.config.temperature  # (B, B + R)
        expected = torch.cat(
            [math.log(B) + self.target_log_probs.to(device)[targets], torch.full((R,), math.log(R / V), device=device)]
        )
        accidental = candidates[None, :] == targets[:, None]
        accidental[:, :B].fill_diagonal_(False)
        logits = (logits.float() - expected).masked_fill(accidental, float("-inf"))
        return F.cross_entropy(logits, torch.arange(B, device=device)), B


@dataclass(frozen=True)
class RankerRecipe:
    """Second stage: every (history, next item) pair whose target the retriever put in its top-C; softmax
    over that target and the hardest other candidates (`train_candidates` in all), with their retriever
    scores. Pairs the retriever missed are left out: the ranker never sees them when serving, and forcing
    their target in would mark it with an out-of-range retriever score, a shortcut that does not exist
    at serving time. The MoE head's load loss is added when the head has one.

    With `holdout_retriever` (a first stage trained without each user's last `holdout_items` training items), the
    pairs are those items only, with that retriever's candidates: the ranker then learns where the first stage is
    as unsure as it is on a test item, not on pairs it was trained on."""

    max_history: int
    batch_size: int
    holdout_retriever: nn.Module | None = None
    holdout_items: int = 1  # the last training items per user the held-out retriever did not see

    def batches(
        self, sequences: Jagged, generator: torch.Generator, timestamps: Jagged | None = None
    ) -> list[HistoryBatch]:
        if self.holdout_retriever is not None:
            pairs = held_out_batches(sequences, self.holdout_items, self.max_history, self.batch_size, generator)
            return list(pairs)
        return list(history_target_batches(sequences, self.max_history, self.batch_size, generator))

    def loss(self, model: nn.Module, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        assert isinstance(model, TwoStageRanker)
        retriever = None
        if self.holdout_retriever is not None:
            retriever = self.holdout_retriever.to(batch.histories.device).eval()
        top = model.candidates(batch.histories, batch.users, retriever)  # (B, C), best first
        hit = top.indices == batch.targets[:, None]
        found = hit.any(dim=1)
        if not bool(found.any()):
            return torch.zeros((), device=hit.device, requires_grad=True), 0
        hit, indices, values = hit[found], top.indices[found], top.values[found]  # (n, C)
        width = min(model.config.train_candidates or indices.shape[1], indices.shape[1])
        negative_rank = (~hit).cumsum(dim=1)  # 1 for the best-scored negative, 2 for the next, ...
        keep = hit | (~hit & (negative_rank <= width - 1))  # the target + the width-1 hardest negatives
        n = indices.shape[0]
        candidates, retrieval = indices[keep].view(n, width), values[keep].view(n, width)
        labels = hit[keep].view(n, width).float().argmax(dim=1)
        logits = model.ranker(batch.histories[found], candidates, retrieval)[0].float()  # (n, width), task 0
        return F.cross_entropy(logits, labels) + model.ranker.aux_loss, n


def recipe_for(
    model: nn.Module,
    data: SequenceData,
    batch_size: int,
    loss: str = "full_softmax",
    num_negatives: int = 0,
    label_smoothing: float = 0.0,
    softmax_within_domain: bool = False,
) -> Recipe:
    """The recipe that trains `model`; `loss` applies to next-item models, `num_negatives` to next-item models'
    sampled softmax and to the two-tower's random negatives, `label_smoothing` to the generative one,
    `softmax_within_domain` to next-item models' full softmax."""
    if isinstance(model, SASRec | HSTU | DomainAdaptedRetriever):
        probs = _sampling_probs(data) if loss == "sampled_softmax" else None
        mask = data.training_excluded()
        excluded = mask if bool(mask.any()) else None
        max_len = model.config.max_len
        domains = data.item_domains() if softmax_within_domain else None
        if domains is not None and loss != "full_softmax":
            raise ValueError("train.softmax_within_domain needs train.loss: full_softmax (or set it to false)")
        return NextItemRecipe(max_len, batch_size, excluded, probs, num_negatives, domains)
    if isinstance(model, GenerativeRetriever):
        return GenerativeRecipe(model.config.max_history, batch_size, label_smoothing)
    if isinstance(model, TwoStageRanker):
        holdout = model.config.holdout_retriever_dir
        retriever = None if holdout is None else _frozen_retriever(Path(holdout), model.config.num_items)
        return RankerRecipe(model.config.max_history, batch_size, retriever, model.config.holdout_items)
    if isinstance(model, TwoTower):
        log_probs = _sampling_probs(data).clamp(min=1e-12).log()
        return TwoTowerRecipe(model.config.max_len, batch_size, log_probs, num_negatives)
    raise TypeError(f"no training recipe for {type(model).__name__}")


def _frozen_retriever(model_dir: Path, num_items: int) -> nn.Module:
    """The trained retriever of `model_dir`, frozen (a ranker's held-out first stage)."""
    from recsys.models.registry import load_trained_model  # the registry imports every model: only needed here

    return load_trained_model(model_dir, num_items)[1].requires_grad_(False)


def _sampling_probs(data: SequenceData) -> torch.Tensor:
    """Training popularity (+1 smoothing so every item can be drawn), 0 at the padding index."""
    counts = data.item_counts().double() + 1.0
    counts[0] = 0.0
    counts[data.training_excluded()] = 0.0  # cold-start items do not exist at training time, nor other domains
    return (counts / counts.sum()).float()
