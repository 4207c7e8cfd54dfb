"""Next-item training with text queries (the "queries" training of a family that reads `Input.QUERIES`, e.g.
the query-aware model): the next-item recipe, with some targets given one of their training queries and some
of those losing their history, so one model learns to recommend, to search and both.

Training queries are made from every item's title by the search protocol's query maker (`recsys.evaluation.queries`,
its training stream: never a test query) and embedded once by the experiment's content encoder (the pipeline's
`embed_content` step); the recipe draws among them.

Dimension letters: B rows, L row width, N real positions, D dim, C encoder dim, Q training queries, V+1 items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import PositiveInt

from recsys.data.batching import PackedBatch
from recsys.data.prepared import TrainingData, TrainingRows
from recsys.errors import ConfigError
from recsys.runtime.atomic import atomic_file
from recsys.runtime.validation import Fraction
from recsys.training.recipes.next_item import NextItemModel, NextItemRecipe, NextItemTraining

QUERIES_FILE = "training_queries.npz"


@dataclass(frozen=True)
class QueryTraining(NextItemTraining):
    """`model.training` of models trained with queries: the next-item settings, and how targets get queries."""

    query_rate: Fraction = 0.5  # share of targets given one of their training queries (the others: history alone)
    no_history_rate: Fraction = 0.2  # share of those whose history is hidden: text search alone
    queries_per_item: PositiveInt = 6  # training queries made per item (the protocol's levels in turn)
    query_seed: int = 0  # the query maker's seed (its training stream)
    llm_queries: bool = False  # add the shopper queries the enrich step's LLM wrote (an `enrich` section needed)


@dataclass(frozen=True)
class QueryBank:
    """Every item's training queries, embedded: item i's are rows offsets[i]:offsets[i+1] of `vectors` and `texts`."""

    vectors: torch.Tensor  # (Q, C) float32
    offsets: torch.Tensor  # (V+2,) int64
    texts: tuple[str, ...]  # (Q,) what the vectors embed (the lexical tower reads them)

    def save(self, path: Path) -> None:
        """Write the bank as one .npz, atomically."""
        with atomic_file(path) as tmp, tmp.open("wb") as handle:
            np.savez(handle, vectors=self.vectors.numpy(), offsets=self.offsets.numpy(), texts=np.array(self.texts))

    @staticmethod
    def load(path: Path) -> QueryBank:
        with np.load(path) as saved:
            vectors, offsets = torch.from_numpy(saved["vectors"]), torch.from_numpy(saved["offsets"])
            return QueryBank(vectors, offsets, tuple(saved["texts"].tolist()))

    @staticmethod
    def load_texts(path: Path) -> dict[int, list[str]]:
        """{item index: its training queries' texts} of a saved bank (what test queries must differ from)."""
        with np.load(path) as saved:
            offsets, texts = saved["offsets"].tolist(), saved["texts"].tolist()
        return {item: texts[offsets[item] : offsets[item + 1]] for item in range(1, len(offsets) - 1)}

    def draw(self, items: torch.Tensor, generator: torch.Generator) -> DrawnQueries:
        """One of each of (N,) items' queries, drawn uniformly."""
        items = items.cpu()
        start, count = self.offsets[items], self.offsets[items + 1] - self.offsets[items]
        pick = (torch.rand(len(items), generator=generator) * count).long()
        rows = (start + pick.clamp(max=(count - 1).clamp(min=0))).clamp(max=max(len(self.vectors) - 1, 0))
        vectors = self.vectors[rows] if len(self.vectors) else torch.zeros(len(items), self.vectors.shape[1])
        has_any = count > 0
        texts = [self.texts[row] if has else "" for row, has in zip(rows.tolist(), has_any.tolist(), strict=True)]
        return DrawnQueries(vectors, texts, has_any)


@dataclass(frozen=True)
class DrawnQueries:
    """A query for each of N targets (`QueryBank.draw`)."""

    vectors: torch.Tensor  # (N, C) their embeddings (zero rows where none)
    texts: list[str]  # (N,) their texts ("" where none)
    has_any: torch.Tensor  # (N,) bool: whether the target has a training query at all


@runtime_checkable
class QueryModel(NextItemModel, Protocol):
    """What the recipe trains: a next-item model whose states fuse with a query (the query-aware model's module
    docstring has the towers)."""

    def without_history(self, count: int) -> torch.Tensor:
        """(count, D) the state of users with no history."""
        ...

    def fuse(
        self, states: torch.Tensor, queries: torch.Tensor, has_query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, D) states + (N, C) query embeddings -> ((N, D') user vectors against `item_embeddings`, (N, 1) the
        weight of the lexical scores); rows where `has_query` is False keep their state."""
        ...

    def lexical_scores(self, texts: Sequence[str], has_query: torch.Tensor) -> torch.Tensor | None:
        """(N,) query texts -> (N, V+1) lexical scores, 0 in rows without a query; None without a lexical tower."""
        ...


@dataclass(frozen=True)
class QueryRecipe:
    """Packed next-item rows (`NextItemRecipe`); each target, at `query_rate`, is predicted from the position's state
    fused with one of its training queries, and at `no_history_rate` of those from h_0 (no history) fused with it."""

    next_item: NextItemRecipe
    bank: QueryBank
    query_rate: float
    no_history_rate: float

    may_skip_parameters: ClassVar[bool] = False
    loss_compiles_with_model: ClassVar[bool] = False  # draws each item's query, and its text, on the host

    @staticmethod
    def create(
        model: QueryModel, data: TrainingData, rows_per_batch: int, settings: QueryTraining, bank: QueryBank | None
    ) -> QueryRecipe:
        if bank is None:
            raise ConfigError(
                "a model trained with queries trains on its items' training queries, made and embedded by the "
                "pipeline's embed_content step. Fix: run it through `recsys train` / `recsys pipeline run`"
            )
        if bank.offsets.numel() != data.num_items + 2:
            raise ConfigError(f"the training queries cover {bank.offsets.numel() - 2} items, the data {data.num_items}")
        return QueryRecipe(
            NextItemRecipe.create(model, data, rows_per_batch, settings), bank, settings.query_rate,
            settings.no_history_rate,
        )  # fmt: skip

    def batches(self, rows: TrainingRows, generator: torch.Generator) -> list[PackedBatch]:
        return self.next_item.batches(rows, generator)

    def loss(self, model: QueryModel, batch: PackedBatch, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        states, targets = self.next_item.hidden_states(model, batch)  # (N, D), (N,)
        queries = self.bank.draw(targets, generator)
        draws = torch.rand(2, len(targets), generator=generator)
        queried = queries.has_any & (draws[0] < self.query_rate)
        hidden = queried & (draws[1] < self.no_history_rate)
        device = states.device
        queried, hidden = queried.to(device), hidden.to(device)
        states = torch.where(hidden[:, None], model.without_history(len(states)), states)
        fused, lexical_weight = model.fuse(states, queries.vectors.to(states), queried)
        lexical = model.lexical_scores(queries.texts, queried)  # (N, V+1) BM25, or None without the tower
        biases = None if lexical is None else lexical_weight * lexical.to(lexical_weight)
        return self.next_item.targets_loss(model, fused, targets, generator, biases), targets.numel()
