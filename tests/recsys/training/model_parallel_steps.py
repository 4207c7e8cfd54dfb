"""What the model-parallel tests run: K steps of a tiny two-tower whose tables torchrec's DMP shards over the launcher's
processes, and the same K steps in one unsharded process (an importable module: the launcher's processes import it).

Both take the same shares of each batch (rows rank::N), draw each share's negatives from the same generator, step
Adam over the dense parameters and SGD over the tables (fbgemm's fused SGD is torch's update), so what is left between
them is the sharding: the tables' lookups on the processes that hold them (fbgemm's kernels against torch's
EmbeddingBag), the all-to-alls, and the order of float sums.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from recsys.data.batching import HistoryBatch
from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.modules.table_training import TableTraining
from recsys.runtime.distributed import Workers, join, leave, sum_over_workers
from recsys.training.config import HardwareConfig, OptimizationConfig, ScheduleConfig, TrainConfig
from recsys.training.data_parallel import share_of_rows
from recsys.training.model_parallel import ModelParallelLoss, gathered_tables, unshard_tables
from recsys.training.recipes.pairs import TwoTowerRecipe
from recsys.training.trainer import fit

WORLD_SIZE, STEPS, ROWS = 2, 4, 9  # 9 rows: shares of 5 and 4 (each process its own batch size)
DENSE_LR, TABLE_LR = 0.01, 0.5
CONFIG = TwoTowerConfig(num_items=60, max_history=8, user_tower="pooled", recent=2, dim=8, hidden_dim=16,
                        dropout=0.0, user_buckets=10, shard_tables="table_wise", table_optimizer="sgd",
                        table_lr=TABLE_LR)  # fmt: skip


# for a whole fit: the tables' fused row-wise Adagrad keeps an accumulator per row, which a resume must restore
FIT_CONFIG = dataclasses.replace(CONFIG, table_optimizer="rowwise_adagrad", table_lr=0.05)


def tiny_two_tower() -> TwoTower:
    torch.manual_seed(0)
    return TwoTower(CONFIG)


def recipe() -> TwoTowerRecipe:
    uniform = torch.full((CONFIG.num_items + 1,), -math.log(CONFIG.num_items))
    return TwoTowerRecipe(CONFIG.max_history, ROWS, uniform, 6, torch.arange(1, CONFIG.num_items + 1))


def batches() -> list[HistoryBatch]:
    """STEPS batches of ROWS (left-padded history, target, user) rows."""
    generator = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        histories = torch.randint(1, CONFIG.num_items + 1, (ROWS, CONFIG.max_history), generator=generator)
        lengths = torch.randint(1, CONFIG.max_history + 1, (ROWS, 1), generator=generator)
        histories = histories.masked_fill(torch.arange(CONFIG.max_history) < CONFIG.max_history - lengths, 0)
        targets = torch.randint(1, CONFIG.num_items + 1, (ROWS,), generator=generator)
        out.append(HistoryBatch(histories, targets, torch.randint(1, 30, (ROWS,), generator=generator)))
    return out


def negatives_of(rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(100 + rank)


def whole_weights(model: TwoTower) -> dict[str, torch.Tensor]:
    """The model's weights with every table whole (a collective when they are sharded)."""
    with gathered_tables(model):
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def train_unsharded() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, no sharding: each step the mean over the batch's targets of every share's loss."""
    model, steps = tiny_two_tower(), recipe()
    tables = [p for name, p in model.named_parameters() if ".bags." in name]
    dense = [p for name, p in model.named_parameters() if ".bags." not in name]
    adam, sgd = torch.optim.Adam(dense, lr=DENSE_LR), torch.optim.SGD(tables, lr=TABLE_LR)
    generators = [negatives_of(rank) for rank in range(WORLD_SIZE)]
    losses = []
    for batch in batches():
        summed, count = torch.zeros(()), 0
        for rank in range(WORLD_SIZE):
            share, _ = share_of_rows(batch, Workers(rank, WORLD_SIZE))
            loss, n = steps.loss(model, share, generators[rank])
            summed, count = summed + loss * n, count + n
        (summed / count).backward()
        for optimizer in (adam, sgd):
            optimizer.step()
            optimizer.zero_grad()
        losses.append(summed.item() / count)
    return losses, whole_weights(model)


def train_sharded() -> dict[str, Any]:
    """One of the launcher's processes: the same steps with the tables sharded by DMP. Returns the steps' losses (over
    every process), the whole weights after the last step and after loading a state copied after the first one, the
    model made plain again (its weights, its item vectors scored alone), and the plan's placements."""
    torch.set_num_threads(1)
    workers = join(torch.device("cpu"))
    model, steps = tiny_two_tower(), recipe()
    step_loss = ModelParallelLoss(model, steps, workers, TableTraining("table_wise", "sgd", TABLE_LR))
    optimizer = torch.optim.Adam(model.parameters(), lr=DENSE_LR)  # the tables' shards take no gradient: fused SGD
    generator = negatives_of(workers.rank)
    losses, after_first, first_state = [], {}, {}
    for step, batch in enumerate(batches()):
        loss, summed, n = step_loss(batch, generator)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        everyone = sum_over_workers(torch.stack([summed, torch.tensor(float(n))]))
        losses.append(float(everyone[0] / everyone[1]))
        if step == 0:  # what the trainer keeps as its best weights: a copy of the sharded state, loaded back later
            first_state, after_first = copy.deepcopy(model.state_dict()), whole_weights(model)
    last = whole_weights(model)
    model.load_state_dict(first_state)
    reloaded = whole_weights(model)
    unshard_tables(model)  # plain tables again: this process alone scores every item, no collective
    unsharded = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    leave()
    return {"losses": losses, "last": last, "after_first": after_first, "reloaded": reloaded, "unsharded": unsharded,
            "item_vectors": model.item_embeddings().detach(), "placements": step_loss.placements}  # fmt: skip


def fit_straight_and_resumed(data_dir: str, state: str) -> dict[str, dict[str, torch.Tensor]]:
    """One of the launcher's processes: a tiny two-tower whose tables DMP shards (fused row-wise Adagrad) trained two
    epochs straight, and trained one epoch, saved, then resumed for the second by new models in the same processes."""
    torch.set_num_threads(1)
    join(torch.device("cpu"))
    data = load_prepared(Path(data_dir))
    train = TrainConfig(
        seed=3,
        schedule=ScheduleConfig(epochs=2),
        optimization=OptimizationConfig(batch_size=32, lr=3e-3),
        hardware=HardwareConfig(device="cpu", threads=1),
        progress=False,
    )
    evaluation = EvalConfig(ks=(10,), batch_size=64)

    def trained(epochs: int, state_path: Path | None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = TwoTower(dataclasses.replace(FIT_CONFIG, num_items=data.num_items))
        fit(
            model,
            data,
            dataclasses.replace(train, schedule=dataclasses.replace(train.schedule, epochs=epochs)),
            evaluation,
            state_path=state_path,
        )
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    straight = trained(2, None)
    trained(1, Path(state))
    resumed = trained(2, Path(state))
    leave()
    return {"straight": straight, "resumed": resumed}
