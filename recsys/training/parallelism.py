"""How a training run spreads over its processes: one strategy, chosen once at start (`choose_parallelism`, from the
run's processes, its settings and the model), that the trainer calls through one interface (`Parallelism`).

    SingleProcess        one process: the recipe's loss of every whole batch
    DataParallel         each process takes its share of every batch, DDP averages the gradients (data_parallel.py)
    RowShardedItemTable  data parallel, with the item table's rows split over the processes (row_sharding.py;
                         `train.distributed.shard_item_table`)
    ShardedTables        data parallel for the dense parameters, the model's sparse tables sharded by torchrec's DMP and
                         updated by their fused optimizer (model_parallel.py; the model's `table_training`)
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from torch import nn

from recsys.models.family import Model
from recsys.runtime.distributed import Workers
from recsys.training.config import DistributedConfig, TrainConfig
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.model_parallel import (
    ModelParallelLoss,
    TableTraining,
    gathered_tables,
    table_training,
    unshard_tables,
)
from recsys.training.recipes import Recipe
from recsys.training.row_sharding import check_shardable, gathered_item_table, shard_item_table, unshard_item_table


class Parallelism:
    """What the trainer asks of the way a run is spread; by default nothing is split, gathered or saved beside the
    model.

    Args:
        workers: the run's processes.
        settings: the run's `train.distributed`.
    """

    def __init__(self, workers: Workers, settings: DistributedConfig | None = None) -> None:
        self.workers = workers
        self.settings = settings or DistributedConfig()

    def place(self, model: Model[Any], device: torch.device) -> Model[Any]:
        """The model on this process's `device` (split over the processes first, for a strategy that splits it)."""
        return model.to(device)

    def loss(self, model: Model[Any], recipe: Recipe, skips_parameters: bool) -> DataParallelLoss:
        """The loss of a training step, for the placed model (`skips_parameters`: some steps leave parameters out)."""
        return DataParallelLoss(
            model,
            recipe,
            self.workers,
            find_unused_parameters=skips_parameters,
            row_sparse_below=self.settings.row_sparse_below,
        )

    def loss_generator(self, generator: torch.Generator, seed: int, epoch: int) -> torch.Generator:
        """What the loss draws from (negatives) in `epoch`: the data's `generator` in one process."""
        return generator

    def whole_tables(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """A block in which the model's tables are whole on every process (validation scores every item)."""
        return contextlib.nullcontext()

    def unshard(self, model: nn.Module) -> None:
        """Make the trained model whole on every process, to evaluate and write."""

    def state(self) -> dict[str, Any]:
        """Its entries of a training state: what `save` writes, and the template `resume` loads into."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back its entries of `state`, filled from a saved training state."""


class SingleProcess(Parallelism):
    """One process trains on every whole batch."""


class DataParallel(Parallelism):
    """Every process packs the same batches and trains on its share of each (`recsys.training.data_parallel`)."""

    def loss_generator(self, generator: torch.Generator, seed: int, epoch: int) -> torch.Generator:
        """One generator per process and epoch, so that the data's stays the same on every process (each packs the
        same batches) and a resumed epoch draws what it drew."""
        state = np.random.SeedSequence([seed % 2**32, epoch, self.workers.rank]).generate_state(1)[0]
        return torch.Generator().manual_seed(int(state))


class RowShardedItemTable(DataParallel):
    """Data parallel, the item table's rows split over the processes (`recsys.training.row_sharding`)."""

    def place(self, model: Model[Any], device: torch.device) -> Model[Any]:
        shard_item_table(model, self.workers, device)  # each process moves its block only
        return model.to(device)

    def whole_tables(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return gathered_item_table(model)

    def unshard(self, model: nn.Module) -> None:
        unshard_item_table(model)


class ShardedTables(DataParallel):
    """Data parallel for the dense parameters, the model's sparse tables sharded by torchrec's DMP
    (`recsys.training.model_parallel`); the tables' fused optimizer state is saved with the training state."""

    def __init__(self, workers: Workers, tables: TableTraining) -> None:
        super().__init__(workers)
        self.tables = tables
        self.sharded: ModelParallelLoss | None = None  # the loss that holds the sharded tables, once made

    def loss(self, model: Model[Any], recipe: Recipe, skips_parameters: bool) -> DataParallelLoss:
        self.sharded = ModelParallelLoss(model, recipe, self.workers, self.tables)
        return self.sharded

    def whole_tables(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return gathered_tables(model)

    def unshard(self, model: nn.Module) -> None:
        unshard_tables(model)

    def state(self) -> dict[str, Any]:
        return {"table_optimizer": self._sharded().table_optimizer_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        self._sharded().load_table_optimizer_state(state["table_optimizer"])

    def _sharded(self) -> ModelParallelLoss:
        assert self.sharded is not None, "the loss shards the tables: make it first"
        return self.sharded


def choose_parallelism(model: nn.Module, recipe: Recipe, config: TrainConfig, workers: Workers) -> Parallelism:
    """The run's strategy: one process; else the item table split by rows when `train.distributed.shard_item_table`
    asks, the model's tables sharded by DMP when it asks (`table_training`), or plain data parallel.

    Raises:
        ConfigError: a sharding the model or the training settings cannot follow.
    """
    if not workers.distributed:
        return SingleProcess(workers)
    if config.distributed.shard_item_table:
        check_shardable(model, recipe)
        return RowShardedItemTable(workers)
    tables = table_training(model, config.optimization)
    return DataParallel(workers, config.distributed) if tables is None else ShardedTables(workers, tables)
