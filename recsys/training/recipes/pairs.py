"""Models trained on (history, next item) pairs: the generative retriever and the two-tower model.

Dimension letters: B pairs, H history, T semantic-ID levels, R random negatives, D dim, V+1 items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from pydantic import NonNegativeInt, PositiveFloat, PositiveInt

from recsys.data.batching import HistoryBatch, history_target_batches
from recsys.data.prepared import TrainingData, TrainingRows
from recsys.runtime.validation import Fraction
from recsys.training.recipes.next_item import NextItemModel, sampling_probs


@dataclass(frozen=True)
class GenerativeTraining:
    """`model.training` of the generative retriever."""

    label_smoothing: Fraction = 0.0  # smoothing of the cross-entropy on each semantic-ID level
    # each head's logits are divided by it before the cross-entropy: below 1 the loss weighs the codes ranked close
    # to the target more (LETTER's ranking-guided generation loss, Wang et al., CIKM 2024); 1 = plain cross-entropy
    temperature: PositiveFloat = 1.0
    # batch pairs of equal history length, each batch as wide as its histories (`history_target_batches`): the
    # encoder reads the real lengths instead of max_history (3x fewer tokens on Beauty)
    by_length: bool = True
    # with by_length, the batch widths allowed (rising, each >= 1): a batch is left-padded to the narrowest that holds
    # its histories (max_history when none does), so torch.compile's CUDA graphs are recorded for these few shapes
    # instead of one per history length; () = each batch exactly as wide as its histories
    length_buckets: tuple[PositiveInt, ...] = ()
    # > 0: train without each user's last `holdout_last` training items: the held-out twin of a ranker's generative
    # candidate source (model.upstream.extra_holdout_retrievers), as next-item models' holdout_last
    holdout_last: NonNegativeInt = 0

    def __post_init__(self) -> None:
        buckets = list(self.length_buckets)
        if buckets != sorted(set(buckets)):
            raise ValueError(f"length_buckets must rise, each width once: got {buckets}. Fix: e.g. [4, 8, 12]")
        if buckets and not self.by_length:
            raise ValueError(
                "length_buckets applies to batches by length only (by_length: true); with by_length: false every "
                "batch is max_history wide. Fix: set by_length: true, or length_buckets: []"
            )


@dataclass(frozen=True)
class TwoTowerTraining:
    """`model.training` of the two-tower model.

    `objective`: "pairs" (the default): batches of `train.optimization.batch_size` (history, next item) pairs, each
    scored against the batch's targets and `num_negatives` uniform items (`TwoTowerRecipe`); "next_item": a sequence
    user tower trained as SASRec is (`recsys.training.recipes.next_item`): packed rows (`batch_size` counts rows),
    every position's user vector predicting its next item over the whole catalogue (the sampled softmax, with
    `num_negatives` drawn by popularity, above `SAMPLED_SOFTMAX_ABOVE_ITEMS` items). The towers, the index and serving
    are the same either way.
    """

    num_negatives: NonNegativeInt = 1024  # pairs: uniform items beside the batch's targets; next_item: see above
    objective: Literal["pairs", "next_item"] = "pairs"

    def __post_init__(self) -> None:
        if self.objective == "next_item" and not self.num_negatives:
            raise ValueError("objective next_item needs num_negatives >= 1 (the sampled softmax of large catalogues)")


@runtime_checkable
class GenerativeModel(Protocol):
    """What the generative recipe trains: logits of each semantic-ID level of the next item. Methods only: an
    isinstance check reads attributes statically on Python >= 3.12, where a module's buffers are not found."""

    def head_targets(self, items: torch.Tensor) -> torch.Tensor:
        """(B,) item_idx -> (B, N) what each of the model's N heads predicts (the semantic-ID levels' codes, ...)."""
        ...

    def __call__(
        self, histories: torch.Tensor, targets: torch.Tensor, users: torch.Tensor | None
    ) -> list[torch.Tensor]:
        """(B, H) histories, (B,) next items [+ (B,) users] -> N x (B, K_n) logits, one per head, teacher-forced on
        the targets."""
        ...

    @property
    def max_history(self) -> int: ...


class TowerConfig(Protocol):
    @property
    def num_items(self) -> int: ...

    @property
    def temperature(self) -> float: ...


@runtime_checkable
class TwoTowerModel(Protocol):
    """What the two-tower recipe trains: user and item vectors whose cosine / temperature are the logits."""

    @property
    def config(self) -> TowerConfig: ...

    @property
    def max_history(self) -> int: ...

    def encode_queries(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        """(B, H) histories [+ (B,) users] -> (B, D) user vectors."""
        ...

    def encode_items(self, items: torch.Tensor) -> torch.Tensor:
        """(N,) item_idx -> (N, D) item vectors."""
        ...


@runtime_checkable
class PackedRowsTwoTower(NextItemModel, Protocol):
    """A two-tower model the next-item recipe trains (`TwoTowerTraining.objective` next_item): a `NextItemModel` whose
    hidden states are user vectors / temperature, and that says whether its user tower reads packed rows."""

    def check_packed_rows(self) -> None:
        """ConfigError, saying how to fix it, when the user tower cannot read packed rows."""
        ...


def pair_batches(
    rows: TrainingRows, max_history: int, batch_size: int, generator: torch.Generator, by_length: bool = False,
    widths: Sequence[int] = (),
) -> list[HistoryBatch]:  # fmt: skip
    """One epoch of every (history, next item) pair of the training rows (`by_length`, `widths`: see
    `history_target_batches`)."""
    batches = history_target_batches(rows.items, max_history, batch_size, generator, by_length=by_length, widths=widths)
    return list(batches)


@dataclass(frozen=True)
class GenerativeRecipe:
    """TIGER-style: cross-entropy on each level of the next item's semantic ID (and on every other head the model
    has: the dense head's item), averaged over the heads."""

    may_skip_parameters: ClassVar[bool] = False
    loss_compiles_with_model: ClassVar[bool] = True  # its heads' cross-entropies: device work alone

    max_history: int
    batch_size: int
    label_smoothing: float = 0.0
    by_length: bool = True
    temperature: float = 1.0
    holdout_last: int = 0
    length_buckets: tuple[int, ...] = ()

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[HistoryBatch]:
        rows = rows.truncate_last(self.holdout_last) if self.holdout_last else rows
        return pair_batches(rows, self.max_history, self.batch_size, generator, self.by_length, self.length_buckets)

    def loss(self, model: GenerativeModel, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        targets = model.head_targets(batch.targets)  # (B, N)
        logits = model(batch.histories, batch.targets, batch.users)  # N x (B, K_n)
        per_head = [
            F.cross_entropy(lg.float() / self.temperature, targets[:, n], label_smoothing=self.label_smoothing)
            for n, lg in enumerate(logits)
        ]
        return torch.stack(per_head).mean(), batch.targets.numel()


@dataclass(frozen=True)
class TwoTowerRecipe:
    """Softmax over the batch's targets (in-batch negatives) and `num_negatives` items drawn uniformly from those that
    exist at training time (mixed negative sampling, Yang et al. 2020; cold-start items and other domains' are never
    drawn, as no training softmax holds them). Each candidate's logit is corrected by the log of how often it is
    expected in the sample (logQ: batch size x its share of training targets for in-batch ones, num_negatives / the
    pool's size for random ones), so popular items are not over-penalised. Other rows whose target is the row's own
    target are masked out (accidental hits)."""

    may_skip_parameters: ClassVar[bool] = False
    loss_compiles_with_model: ClassVar[bool] = False  # draws its random negatives from a host generator

    max_history: int
    batch_size: int
    target_log_probs: torch.Tensor  # (V+1,) log share of each item among training targets
    num_negatives: int
    negative_pool: torch.Tensor  # (P,) item_idx the random negatives are drawn from

    @staticmethod
    def create(model: TwoTowerModel, data: TrainingData, batch_size: int, settings: TwoTowerTraining) -> TwoTowerRecipe:
        log_probs = sampling_probs(data).clamp(min=1e-12).log()
        pool = torch.nonzero(~data.training_excluded()[1:]).squeeze(1) + 1  # the padding is never a negative
        return TwoTowerRecipe(model.max_history, batch_size, log_probs, settings.num_negatives, pool)

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[HistoryBatch]:
        return pair_batches(rows, self.max_history, self.batch_size, generator)

    def loss(self, model: TwoTowerModel, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        targets, device = batch.targets, batch.targets.device
        B, P, R = targets.numel(), len(self.negative_pool), self.num_negatives
        random = self.negative_pool[torch.randint(0, P, (R,), generator=generator)].to(device)
        candidates = torch.cat([targets, random])  # (B + R,)
        users = model.encode_queries(batch.histories, batch.users)  # (B, D)
        logits = users @ model.encode_items(candidates).T / model.config.temperature  # (B, B + R)
        expected = torch.cat(
            [math.log(B) + self.target_log_probs.to(device)[targets], torch.full((R,), math.log(R / P), device=device)]
        )
        accidental = candidates[None, :] == targets[:, None]
        accidental[:, :B].fill_diagonal_(False)
        logits = (logits.float() - expected).masked_fill(accidental, float("-inf"))
        return F.cross_entropy(logits, torch.arange(B, device=device)), B
