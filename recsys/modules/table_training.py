"""How a model's sparse tables train when a distributed run shards them with torchrec's DistributedModelParallel
(`recsys.training.model_parallel`): their placement and the optimizer fused into their backward pass. A model that
shards its tables says so through a `table_training()` method returning this (the two-tower's `model.shard_tables`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Sharding = Literal["table_wise", "row_wise"]
TableOptimizer = Literal["rowwise_adagrad", "adagrad", "sgd", "adam"]


@dataclass(frozen=True)
class TableTraining:
    """How the sharded tables are placed and updated (`model.shard_tables`, `model.table_optimizer`, `.table_lr`)."""

    sharding: Sharding
    optimizer: TableOptimizer = "rowwise_adagrad"
    lr: float = 0.01
