"""The two-stage ranker: the first stage's candidates, re-scored; ranking is task 0, the data's other tasks
(`recsys.data.tasks`) are trained on the same examples.

Dimension letters: B pairs in a batch, n pairs whose target the first stage found, C candidates, T tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt

from recsys.data.batching import HistoryBatch, held_out_batches, history_target_batches
from recsys.data.prepared import SequenceData, TrainingRows
from recsys.data.tasks import Task
from recsys.models.family import Model
from recsys.models.sources import Candidates, untrained_items
from recsys.training.losses import candidate_softmax_loss, task_loss


@dataclass(frozen=True)
class RankerTraining:
    """`model.training` of the two-stage ranker."""

    # softmax over the target and the hardest others, this many in all; None = C
    train_candidates: Annotated[int, Field(ge=2)] | None = None
    # with model.upstream.holdout_retriever: the last training items per user that first stage did not see (its
    # holdout_last)
    holdout_items: PositiveInt = 1
    # per task beside ranking (the data's and category_l<k>); 1.0 where not named
    task_weights: dict[str, float] = field(default_factory=dict)
    # with a new_items source: this share of the catalogue, drawn afresh for each batch, is handled as new (never
    # trained on by a first stage: not proposed by one, no ID vector), so that the ranker meets new targets about
    # as often as it will serve them (near the share of served targets that are new); 0: only the items no first
    # stage saw are new
    new_item_rate: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


@runtime_checkable
class RankerModel(Protocol):
    """What the ranker recipe trains: a frozen first stage's candidates, re-scored per task."""

    @property
    def tasks(self) -> tuple[Task, ...]:
        """The tasks beside ranking, in the order of the logits' rows 1.."""
        ...

    @property
    def category_tasks(self) -> tuple[str, ...]:
        """The category tasks (category_l1 ..), in the order of `category_logits`."""
        ...

    def category_logits(self, histories: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(B, L) histories -> K x (B, n_k + 1) the next item's category logits, and the head's load loss."""
        ...

    def item_categories(self, items: torch.Tensor) -> torch.Tensor:
        """(B,) items -> (B, K) their category ids (0: none)."""
        ...

    @property
    def max_history(self) -> int: ...

    @property
    def extra_retriever_count(self) -> int:
        """Its further first stages (model candidate sources)."""
        ...

    @property
    def new_items(self) -> torch.Tensor | None:
        """(V+1,) bool: the items no first stage was trained on, where it has a new_items source (else None)."""
        ...

    @property
    def aux_loss(self) -> torch.Tensor:
        """The load-balancing loss of the last `rank_candidates` (0 without one)."""
        ...

    def candidates(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        retriever: Model[Any] | None = None,
        untrained: torch.Tensor | None = None,
        extra_retrievers: tuple[Model[Any], ...] = (),
    ) -> Candidates:
        """Each row's candidates, best first, from the sources (`retriever`, `extra_retrievers` and `untrained`,
        the items they were not trained on, standing in for the first stages' own)."""
        ...

    def rank_candidates(
        self,
        histories: torch.Tensor,
        candidates: torch.Tensor,
        retrieval: torch.Tensor,
        source_features: torch.Tensor | None = None,
        untrained: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) histories, (B, C) candidates, their first-stage scores [, per-source features, the items no first
        stage was trained on] -> (T, B, C) logits per task."""
        ...


@dataclass(frozen=True)
class RankerRecipe:
    """Every (history, next item) pair whose target the first stage put in its top-C: softmax over that target and
    the hardest other candidates (`train_candidates` in all), with their first-stage scores; each other task's loss
    on the target's labels; each category task's cross-entropy on the target's category at its level (targets without
    one at that level left out), on the same pairs. Pairs the first stage missed are left out: the ranker never sees
    them when serving, and forcing their target in would mark it with an out-of-range first-stage score, a shortcut
    that does not exist at serving time. The MoE head's load loss is added when the head has one.

    With `holdout_retriever` (a first stage trained without each user's last `holdout_items` training items), the
    pairs are those items only, with that retriever's candidates: the ranker then learns where the first stage is
    as unsure as it is on a test item, not on pairs it was trained on."""

    # a batch whose targets the first stage missed has no loss, and an MoE head routes around its idle experts
    may_skip_parameters: ClassVar[bool] = True
    loss_compiles_with_model: ClassVar[bool] = False  # its candidates' sizes are read on the host

    max_history: int
    batch_size: int
    tasks: tuple[Task, ...] = ()  # the model's tasks beside ranking, in its head's order
    task_weights: tuple[float, ...] = ()
    category_weights: tuple[float, ...] = ()  # of the model's category tasks, in their order
    train_candidates: int | None = None
    holdout_retriever: Model[Any] | None = None
    holdout_items: int = 1
    # (V+1,) bool: the items the held-out twin never saw (only in users' last `holdout_items`), which a new_items
    # source proposes for the training pairs; None without a twin (the ranker's own, from the training data)
    holdout_untrained: torch.Tensor | None = None
    extra_holdout_retrievers: tuple[Model[Any], ...] = ()  # the held-out twins of the ranker's extra retrievers
    new_item_rate: float = 0.0  # RankerTraining.new_item_rate

    @staticmethod
    def create(
        model: RankerModel,
        data: SequenceData,
        batch_size: int,
        settings: RankerTraining,
        holdout_retriever: Model[Any] | None = None,
        extra_holdout_retrievers: tuple[Model[Any], ...] = (),
    ) -> RankerRecipe:
        tasks = model.tasks
        names = [task.name for task in tasks]
        missing = [name for name in names if name not in data.tasks]
        categories = model.category_tasks
        unknown = [name for name in settings.task_weights if name not in (*names, *categories)]
        if missing or unknown:
            raise ValueError(
                f"the ranker's tasks {names} are not those of the data ({list(data.tasks)}): missing {missing}, "
                f"task_weights for other tasks {unknown}. Fix: train it on data with those labels, or name its tasks"
            )
        extras = model.extra_retriever_count
        if holdout_retriever is not None and len(extra_holdout_retrievers) != extras:
            raise ValueError(
                f"the ranker learns on its held-out first stage's candidates, and has {extras} extra retrievers with "
                f"{len(extra_holdout_retrievers)} held-out twins: their candidates would include the very items it "
                "learns on. Fix: name each one's twin, in order, under model.upstream.extra_holdout_retrievers"
            )
        if settings.new_item_rate and model.new_items is None:
            raise ValueError(
                f"model.training.new_item_rate {settings.new_item_rate} hands the ranker items as new, which only a "
                "new_items source proposes. Fix: add {kind: new_items, top: N} to model.params.sources, or set it to 0"
            )
        untrained = None
        if holdout_retriever is not None:
            rows = next(iter(data.training_epoch(torch.Generator())))
            seen = torch.bincount(rows.items.truncate_last(settings.holdout_items).values, minlength=data.num_items + 1)
            untrained = untrained_items(seen)
        return RankerRecipe(
            max_history=model.max_history,
            batch_size=batch_size,
            tasks=tasks,
            task_weights=tuple(settings.task_weights.get(name, 1.0) for name in names),
            category_weights=tuple(settings.task_weights.get(name, 1.0) for name in categories),
            train_candidates=settings.train_candidates,
            holdout_retriever=holdout_retriever,
            holdout_items=settings.holdout_items,
            holdout_untrained=untrained,
            extra_holdout_retrievers=extra_holdout_retrievers,
            new_item_rate=settings.new_item_rate,
        )

    def _with_new_items(self, untrained: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(V+1,) bool the items no first stage saw, and `new_item_rate` of the others drawn for this batch."""
        if not self.new_item_rate:
            return untrained
        drawn = torch.rand(untrained.shape[0], generator=generator) < self.new_item_rate
        drawn[0] = False  # never the padding
        return untrained.cpu() | drawn

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[HistoryBatch]:
        labels = [rows.labels[task.name] for task in self.tasks]
        if self.holdout_retriever is not None:
            held_out = self.holdout_items
            return list(held_out_batches(rows.items, held_out, self.max_history, self.batch_size, generator, labels))
        return list(history_target_batches(rows.items, self.max_history, self.batch_size, generator, labels))

    def loss(self, model: RankerModel, batch: HistoryBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        device = batch.histories.device
        retriever, untrained = None, model.new_items
        extras: tuple[Model[Any], ...] = ()
        if self.holdout_retriever is not None:
            retriever = self.holdout_retriever.to(device)
            untrained = self.holdout_untrained
            extras = tuple(twin.to(device) for twin in self.extra_holdout_retrievers)
        if untrained is not None:
            untrained = self._with_new_items(untrained, generator).to(device)
        # the ranker reads new items without their ID vector where it serves them so (a new_items source)
        unseen = untrained if model.new_items is not None else None
        found_all = model.candidates(batch.histories, batch.users, retriever, untrained, extras)  # (B, C)
        hit = found_all.items == batch.targets[:, None]
        found = hit.any(dim=1)
        if not bool(found.any()):
            return torch.zeros((), device=hit.device, requires_grad=True), 0
        hit, indices, values = hit[found], found_all.items[found], found_all.retrieval[found]  # (n, C)
        real = indices != 0  # rows of a union are padded to the widest
        available = int(real.sum(dim=1).min())
        width = min(self.train_candidates or available, available)
        negative_rank = (~hit & real).cumsum(dim=1)  # 1 for the best-placed negative, 2 for the next, ...
        keep = hit | (~hit & real & (negative_rank <= width - 1))  # the target + the width-1 best-placed negatives
        n = indices.shape[0]
        candidates, retrieval = indices[keep].view(n, width), values[keep].view(n, width)
        features = None
        if found_all.features is not None:
            features = found_all.features[found][keep].view(n, width, -1)
        target = hit[keep].view(n, width).float().argmax(dim=1)  # (n,) the target's column
        logits = model.rank_candidates(batch.histories[found], candidates, retrieval, features, unseen)
        loss = candidate_softmax_loss(logits[0], target)
        for t, (task, weight) in enumerate(zip(self.tasks, self.task_weights, strict=True), start=1):
            assert batch.labels is not None  # the batches carry a label column per task
            at_target = logits[t].gather(1, target[:, None]).squeeze(1)
            loss = loss + weight * task_loss(task.kind, at_target, batch.labels[found, t - 1])
        loss = loss + model.aux_loss
        if self.category_weights:
            category_logits, aux = model.category_logits(batch.histories[found])
            truth = model.item_categories(batch.targets[found])  # (n, K)
            for level, (weight, z) in enumerate(zip(self.category_weights, category_logits, strict=True)):
                known = truth[:, level] > 0
                if bool(known.any()):
                    loss = loss + weight * F.cross_entropy(z[known].float(), truth[known, level])
            loss = loss + aux
        return loss, n
