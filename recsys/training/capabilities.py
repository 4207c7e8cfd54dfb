"""What training asks of a model beyond the batches and loss of its recipe: typed protocols a model meets by having
their methods (no model is named here), so the trainer, the recipes and distributed training ask "can it?" rather
than "which model is it?".

    ItemIdTable       items represented by one ID table alone: a step may read just the rows it needs (sparse
                      gradients), several processes may split its rows (`recsys.training.row_sharding`)
    FitsItemCounts    fitted on training item counts instead of by gradient (popularity)
    TrainsPerDomain   one adapter per domain, each trained on its domain's users over a frozen base (domain adapters)

(The tables torchrec shards are `recsys.training.model_parallel.ShardedTablesModel`'s.)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from recsys.errors import ConfigError


@runtime_checkable
class ItemIdTable(Protocol):
    """A model whose item vectors may be an ID table read through its module (SASRec, HSTU)."""

    def item_id_table(self) -> nn.Embedding | None:
        """The table, when it alone is the items' vectors; None when other features build them (semantic IDs)."""
        ...

    def replace_item_id_table(self, table: nn.Embedding) -> None:
        """Put `table` in its place (a whole copy of a sharded one, and back)."""
        ...

    def item_rows(self, items: torch.Tensor) -> torch.Tensor:
        """(...,) item_idx -> (..., D) their output vectors, as `item_embeddings()[items]`, read row by row where the
        table allows (so its gradient holds those rows only)."""
        ...


@runtime_checkable
class FitsItemCounts(Protocol):
    """A model fitted on training item counts instead of by gradient."""

    def fit(self, item_counts: torch.Tensor) -> None:
        """(V+1,) training frequency per item_idx."""
        ...


@runtime_checkable
class TrainsPerDomain(Protocol):
    """A model of several domains trained one domain at a time (an adapter each, its base frozen)."""

    @property
    def domains(self) -> tuple[str, ...]: ...

    def check_domain_training(self, full_softmax: bool, weight_decay: float) -> None:
        """ConfigError when training one domain with these settings would move another domain's parameters."""
        ...


def item_id_table(model: object) -> nn.Embedding | None:
    """`model`'s item ID table when it has one that alone holds its item vectors, else None."""
    return model.item_id_table() if isinstance(model, ItemIdTable) else None


def use_sparse_item_gradients(model: object) -> None:
    """Make `model`'s item table's gradient row-sparse (the rows a step read; SparseAdam then updates those alone);
    ConfigError when it has no table a step can read row by row."""
    table = item_id_table(model)
    if table is None:
        raise ConfigError(
            f"model.training.sparse_item_gradients: the {type(model).__name__} model has no ID table a step can read "
            "row by row (SASRec with semantic IDs reads them all). Fix: set it to false"
        )
    table.sparse = True
