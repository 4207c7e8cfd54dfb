"""Next-item models (SASRec, HSTU, domain adapters): packed sequences, the hidden state at every position predicts
the next item, over the whole catalog (full softmax) or a sample of it (sampled softmax with logQ correction: shared
negatives drawn by popularity, mixed with the batch's other targets).

Dimension letters: B rows, L row width (the model's history window), N real positions, D dim, V+1 items.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, runtime_checkable

import torch
from pydantic import NonNegativeInt, PositiveInt

from recsys.data.batching import PackedBatch, packed_next_item_batches
from recsys.data.prepared import TrainingData, TrainingRows
from recsys.errors import ConfigError
from recsys.training.capabilities import ItemIdTable, use_sparse_item_gradients
from recsys.training.losses import NegativeSampler, full_softmax_loss, sampled_softmax_loss

logger = logging.getLogger(__name__)

# `loss: auto` trains catalogues above this many items with the sampled softmax: the full softmax's logits of one step
# (targets x items floats, and as many gradients) pass ~0.5 GB there at Beauty's ~700 targets a step and grow with the
# catalogue, while a sampled step's cost follows num_negatives. Below it the full softmax is exact and cheap enough.
SAMPLED_SOFTMAX_ABOVE_ITEMS = 100_000

Loss = Literal["full_softmax", "sampled_softmax"]


@dataclass(frozen=True)
class NextItemTraining:
    """`model.training` of next-item models."""

    # "auto": the full softmax up to SAMPLED_SOFTMAX_ABOVE_ITEMS items, the sampled softmax above
    loss: Literal["auto", "full_softmax", "sampled_softmax"] = "auto"
    num_negatives: PositiveInt = 1024  # sampled_softmax: negatives per batch, drawn by training popularity
    # sampled_softmax: the batch's other targets are negatives too (mixed negatives: free, and drawn by the data's
    # own popularity), each corrected by its expected count in the sample
    in_batch_negatives: bool = True
    # multi-domain data, full softmax: each target's softmax over its own domain's items only (those it is ranked
    # against), not the whole catalog
    softmax_within_domain: bool = False
    # > 0: train without each user's last `holdout_last` training items, for a ranker to learn on them (its
    # model.upstream.holdout_retriever); validation and test are unchanged
    holdout_last: NonNegativeInt = 0
    # sampled_softmax: the item table's gradient holds the rows a step read (inputs, targets, negatives) and
    # SparseAdam updates only those (lazy Adam: a row's moments advance when it is read), so a step costs what the
    # batch reads, not the catalogue. Models with an ID table alone (SASRec without semantic IDs, HSTU)
    sparse_item_gradients: bool = False

    def __post_init__(self) -> None:
        if self.softmax_within_domain and self.loss == "sampled_softmax":
            raise ValueError("softmax_within_domain needs loss: full_softmax (or set it to false)")
        if self.sparse_item_gradients and self.loss == "full_softmax":
            raise ValueError(
                "sparse_item_gradients needs loss: sampled_softmax (the full softmax reads every row each step)"
            )

    def resolved_loss(self, num_items: int) -> Loss:
        """The loss trained on a catalogue of `num_items` items (`auto` decided); ConfigError when the settings that
        need one loss meet the other."""
        loss: Loss = self.loss if self.loss != "auto" else _auto_loss(num_items)
        if self.softmax_within_domain and loss == "sampled_softmax":
            raise ConfigError(
                f"model.training.softmax_within_domain needs the full softmax, and loss: auto picks the sampled one "
                f"for {num_items:,} items (> {SAMPLED_SOFTMAX_ABOVE_ITEMS:,}). Fix: set loss: full_softmax"
            )
        if self.sparse_item_gradients and loss == "full_softmax":
            raise ConfigError(
                f"model.training.sparse_item_gradients needs the sampled softmax, and loss: auto picks the full one "
                f"for {num_items:,} items (<= {SAMPLED_SOFTMAX_ABOVE_ITEMS:,}). Fix: set loss: sampled_softmax"
            )
        return loss


def _auto_loss(num_items: int) -> Loss:
    loss: Loss = "sampled_softmax" if num_items > SAMPLED_SOFTMAX_ABOVE_ITEMS else "full_softmax"
    logger.info("model.training.loss auto: %s for %s items (sampled above %s)", loss, f"{num_items:,}",
                f"{SAMPLED_SOFTMAX_ABOVE_ITEMS:,}")  # fmt: skip
    return loss


@runtime_checkable
class NextItemModel(Protocol):
    """What the next-item recipe trains: hidden states at every packed position, scored against item vectors."""

    def __call__(self, *packed: torch.Tensor) -> torch.Tensor:
        """(B, L) packed items, segments, positions [+ the items' and the targets' times, for models that read
        them] -> (B, L, D) hidden states."""
        ...

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) the output item vectors."""
        ...

    @property
    def max_history(self) -> int: ...

    @property
    def reads_timestamps(self) -> bool: ...


@dataclass(frozen=True)
class NextItemRecipe:
    """Packed rows of the model's window; every real position's next item is a target.

    Args:
        max_history: the model's window (the row width).
        rows_per_batch: packed rows per batch.
        excluded: (V+1,) bool, items that are never candidates in training (cold-start items), or None.
        sampling_probs: (V+1,) negative-sampling distribution for sampled softmax; None = full softmax.
        num_negatives: negatives per batch (sampled softmax only).
        in_batch_negatives: the batch's other targets are negatives too (sampled softmax only).
        item_domains: (V+1,) every item's domain index: each target's full softmax covers its domain's items only.
        reads_timestamps: pack the inputs' and targets' times beside them (time-aware models).
        holdout_last: training rows lose their last this-many items.
        index_targets: batches carry every target's index in the trained rows (`trained_rows`), for recipes that
            look up what was computed per target beforehand (a teacher's scores, `DistillationRecipe`).
    """

    may_skip_parameters: ClassVar[bool] = False
    # the sampled softmax draws its negatives on the host; the full softmax's loss would compile whole, but is not yet
    # timed against the eager one
    loss_compiles_with_model: ClassVar[bool] = False

    max_history: int
    rows_per_batch: int
    excluded: torch.Tensor | None = None
    sampling_probs: torch.Tensor | None = None
    num_negatives: int = 0
    in_batch_negatives: bool = False
    item_domains: torch.Tensor | None = None
    reads_timestamps: bool = False
    holdout_last: int = 0
    index_targets: bool = False
    sampler: NegativeSampler | None = field(init=False, repr=False, compare=False)  # of sampling_probs

    def __post_init__(self) -> None:
        sampler = None if self.sampling_probs is None else NegativeSampler(self.sampling_probs)
        object.__setattr__(self, "sampler", sampler)  # frozen: derived once, here

    @staticmethod
    def create(
        model: NextItemModel, data: TrainingData, rows_per_batch: int, settings: NextItemTraining
    ) -> NextItemRecipe:
        sampled = settings.resolved_loss(data.num_items) == "sampled_softmax"
        if settings.sparse_item_gradients:
            use_sparse_item_gradients(model)
        mask = data.training_excluded()
        return NextItemRecipe(
            max_history=model.max_history,
            rows_per_batch=rows_per_batch,
            excluded=mask if bool(mask.any()) else None,
            sampling_probs=sampling_probs(data) if sampled else None,
            num_negatives=settings.num_negatives,
            in_batch_negatives=sampled and settings.in_batch_negatives,
            item_domains=data.item_domains() if settings.softmax_within_domain else None,
            reads_timestamps=model.reads_timestamps,
            holdout_last=settings.holdout_last,
        )

    def trained_rows(self, rows: TrainingRows) -> TrainingRows:
        """The rows the batches are packed from: `rows` without each one's last `holdout_last` items."""
        return rows.truncate_last(self.holdout_last) if self.holdout_last else rows

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[PackedBatch]:
        rows = self.trained_rows(rows)
        timestamps = rows.timestamps if self.reads_timestamps else None
        packed = packed_next_item_batches(
            rows.items, self.max_history, self.rows_per_batch, generator, timestamps, self.index_targets
        )
        return list(packed)

    def loss(self, model: NextItemModel, batch: PackedBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        hidden, targets = self.hidden_states(model, batch)
        return self.targets_loss(model, hidden, targets, generator), targets.numel()

    @staticmethod
    def hidden_states(model: NextItemModel, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The (N, D) states at the batch's real positions and their (N,) targets."""
        real = batch.flat_real_positions()  # (N,): found on the host when the batch was moved, so no sync here
        times = () if batch.timestamps is None else (batch.timestamps, batch.next_timestamps)
        hidden = model(batch.inputs, batch.segments, batch.positions, *times).flatten(0, 1)  # (B L, D)
        return hidden.index_select(0, real), batch.targets.reshape(-1).index_select(0, real)

    def targets_loss(
        self,
        model: NextItemModel,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        generator: torch.Generator,
        biases: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean loss of (N, D) states predicting their (N,) targets, over the catalogue or a sample of it; `biases`
        (N, V+1): logits added to the dot products, or None."""
        if self.sampler is not None:
            probs, _ = self.sampler.on(hidden.device)
            drawn = self.sampler.draw(self.num_negatives, generator, hidden.device)
            vectors = item_rows(model, torch.cat([targets, drawn]))  # one lookup: one sparse gradient
            positives, negatives, negative_vectors = vectors[: targets.numel()], drawn, vectors[targets.numel() :]
            if self.in_batch_negatives:
                negatives, negative_vectors = torch.cat([drawn, targets]), torch.cat([negative_vectors, positives])
            return sampled_softmax_loss(hidden, positives, negative_vectors, targets, negatives, probs, biases)
        excluded = None if self.excluded is None else self.excluded.to(hidden.device)
        if self.item_domains is not None:  # (N, V+1): other domains' items are out of each target's softmax
            domains = self.item_domains.to(hidden.device)
            other = domains[None, :] != domains[targets][:, None]
            excluded = other if excluded is None else other | excluded[None, :]
        return full_softmax_loss(hidden, model.item_embeddings(), targets, excluded, biases)


def item_rows(model: NextItemModel, items: torch.Tensor) -> torch.Tensor:
    """The output vectors of `items`: looked up alone by models that can (their item table's gradient then touches
    those rows only, `sparse_item_gradients`), else rows of the whole table."""
    return model.item_rows(items) if isinstance(model, ItemIdTable) else model.item_embeddings()[items]


def sampling_probs(data: TrainingData) -> torch.Tensor:
    """Training popularity (+1 smoothing so every item can be drawn), 0 at the padding index."""
    counts = data.item_counts().double() + 1.0
    counts[0] = 0.0
    counts[data.training_excluded()] = 0.0  # cold-start items do not exist at training time, nor other domains
    return (counts / counts.sum()).float()
