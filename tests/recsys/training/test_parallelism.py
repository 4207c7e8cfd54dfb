"""Which parallelism strategy a training run picks (`recsys.training.parallelism.choose_parallelism`), decided without a
process group; what each strategy does in training is the 2-process tests' (test_data_parallel.py,
test_row_sharding*.py, test_model_parallel.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.errors import ConfigError
from recsys.runtime.distributed import Workers
from recsys.training.config import DistributedConfig, TrainConfig
from recsys.training.parallelism import (
    DataParallel,
    RowShardedItemTable,
    ShardedTables,
    SingleProcess,
    choose_parallelism,
)
from tests.recsys.training.distributed_fit import SAMPLED, recipe_of, small_sasrec
from tests.recsys.training.model_parallel_steps import recipe, tiny_two_tower

TRAIN = TrainConfig()
SHARD_ITEM_TABLE = dataclasses.replace(TRAIN, distributed=DistributedConfig(shard_item_table=True))
ONE, FIRST_OF_TWO, SECOND_OF_TWO = Workers(), Workers(rank=0, world_size=2), Workers(rank=1, world_size=2)


def test_each_setting_picks_its_strategy(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    sasrec = small_sasrec(data.num_items)
    sampled = recipe_of(sasrec, data, SAMPLED)
    assert type(choose_parallelism(sasrec, sampled, SHARD_ITEM_TABLE, ONE)) is SingleProcess  # nothing to split
    assert type(choose_parallelism(sasrec, sampled, TRAIN, FIRST_OF_TWO)) is DataParallel
    assert type(choose_parallelism(sasrec, sampled, SHARD_ITEM_TABLE, FIRST_OF_TWO)) is RowShardedItemTable
    two_tower = tiny_two_tower()  # its tables ask to be sharded (model.shard_tables)
    assert type(choose_parallelism(two_tower, recipe(), TRAIN, ONE)) is SingleProcess
    assert type(choose_parallelism(two_tower, recipe(), TRAIN, FIRST_OF_TWO)) is ShardedTables


def test_a_sharding_the_model_or_settings_cannot_follow_fails_at_the_choice(tiny_data_dir: Path) -> None:
    with pytest.raises(ConfigError, match="shard_item_table shards an item-id table"):
        choose_parallelism(tiny_two_tower(), recipe(), SHARD_ITEM_TABLE, FIRST_OF_TWO)
    data = load_prepared(tiny_data_dir)
    sasrec = small_sasrec(data.num_items)
    with pytest.raises(ConfigError, match="with the full softmax"):
        choose_parallelism(sasrec, recipe_of(sasrec, data), SHARD_ITEM_TABLE, FIRST_OF_TWO)
    scheduled = dataclasses.replace(TRAIN, optimization=dataclasses.replace(TRAIN.optimization, lr_schedule="cosine"))
    with pytest.raises(ConfigError, match="lr_schedule: constant"):
        choose_parallelism(tiny_two_tower(), recipe(), scheduled, FIRST_OF_TWO)


def test_the_loss_draws_from_the_data_generator_alone_or_one_per_process_and_epoch() -> None:
    data_generator = torch.Generator().manual_seed(0)
    assert SingleProcess(ONE).loss_generator(data_generator, seed=3, epoch=2) is data_generator

    def draws(workers: Workers, epoch: int) -> torch.Tensor:
        return torch.rand(4, generator=DataParallel(workers).loss_generator(data_generator, seed=3, epoch=epoch))

    assert torch.equal(draws(FIRST_OF_TWO, 2), draws(FIRST_OF_TWO, 2))  # a resumed epoch draws what it drew
    assert not torch.equal(draws(FIRST_OF_TWO, 2), draws(SECOND_OF_TWO, 2))
    assert not torch.equal(draws(FIRST_OF_TWO, 2), draws(FIRST_OF_TWO, 3))
