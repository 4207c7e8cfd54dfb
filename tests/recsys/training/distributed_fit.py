"""What each process of the data-parallel tests runs (an importable module: the launcher's processes import it)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from recsys.data.batching import HistoryBatch
from recsys.data.prepared import SequenceData, load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.distributed import Workers, gather_rows, join, leave, reduce_on_hosts
from recsys.training.compilation import compile_model, compiled_graphs
from recsys.training.config import (
    DistributedConfig,
    HardwareConfig,
    OptimizationConfig,
    ScheduleConfig,
    TrainConfig,
)
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.recipes import GenerativeRecipe, NextItemTraining, Recipe, recipe_for
from recsys.training.row_sharding import shard_item_table
from recsys.training.row_sparse_reduction import RowSparseReduction
from recsys.training.trainer import fit
from tests.conftest import tiny_generative

EVAL = EvalConfig(ks=(10,), batch_size=64)
# one thread and no dropout: what is left between one process and two is the order of float sums
# two batches a step: the processes keep their gradients to themselves between updates (DDP no_sync)
TRAIN = TrainConfig(
    seed=3,
    schedule=ScheduleConfig(epochs=2, patience=5),
    optimization=OptimizationConfig(batch_size=8, accumulate_batches=2, lr=1e-3),
    hardware=HardwareConfig(device="cpu", threads=1),
    progress=False,
)


def small_sasrec(num_items: int) -> SASRec:
    torch.manual_seed(0)
    config = SASRecConfig(num_items=num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.0,
                          attn_dropout=0.0)  # fmt: skip
    return SASRec(config)


# the sampled softmax without in-batch negatives: every process draws the same negatives from the same generator, so
# the shares' losses add up to the whole batch's
SAMPLED = NextItemTraining(loss="sampled_softmax", num_negatives=64, in_batch_negatives=False)


def recipe_of(model: SASRec, data: SequenceData, training: NextItemTraining | None = None) -> Recipe:
    return recipe_for(model, data, TRAIN.optimization.batch_size, training or NextItemTraining(loss="full_softmax"))


def first_step_gradients(
    data: SequenceData, workers: Workers, device: torch.device, training: NextItemTraining | None = None,
    shard: bool = False,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The gradients of the first batch of an epoch, as this process's share of it gives them after DDP's average
    (with `shard`, the item table's rows split over the processes; its gradient gathered whole)."""
    model = small_sasrec(data.num_items)
    recipe = recipe_of(model, data, training)
    if shard:
        shard_item_table(model, workers, device)
    model.to(device)
    generator = torch.Generator().manual_seed(TRAIN.seed)
    batch = next(batch for rows in data.training_epoch(generator) for batch in recipe.batches(rows, generator))
    batch = batch.to(device)
    step_loss = DataParallelLoss(model, recipe, workers, find_unused_parameters=False)  # alive through backward:
    loss, _, _ = step_loss(batch, generator)  # DDP averages the gradients in hooks its reducer holds
    loss.backward()
    return {name: _whole(p.grad).cpu() for name, p in model.named_parameters() if p.grad is not None}


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def train_sharded(data_dir: str, out: str) -> None:
    """One step's gradients and two epochs of training of a small SASRec whose item table is split by rows over the
    processes (plain on one process); the first process writes them, with the rows each process held, to `out`."""
    torch.set_num_threads(1)
    data = load_prepared(Path(data_dir))
    workers = join(torch.device("cpu"))
    gradients = first_step_gradients(data, workers, torch.device("cpu"), SAMPLED, shard=workers.distributed)
    model = small_sasrec(data.num_items)
    held = _rows_held(data, workers) if workers.distributed else []
    train = dataclasses.replace(TRAIN, distributed=DistributedConfig(shard_item_table=True))
    result = fit(model, data, train, EVAL, recipe_of(model, data, SAMPLED))
    if workers.is_main:
        torch.save({"gradients": gradients, "weights": model.state_dict(), "held": held,
                    "best_valid": result.best_valid}, out)  # fmt: skip
    leave()


def train_sampled_replicated(data_dir: str, out: str, device: str = "cpu") -> None:
    """One step's gradients and two epochs of training of a small SASRec by the sampled softmax, its item table whole
    on every process (on several, averaged by the rows each update touched: `RowSparseReduction`), on `device`
    ("cpu" under gloo, "cuda" under NCCL); the first process writes them to `out`."""
    torch.set_num_threads(1)
    data = load_prepared(Path(data_dir))
    workers = join(torch.device(device))
    gradients = first_step_gradients(data, workers, workers.device(torch.device(device)), SAMPLED)
    model = small_sasrec(data.num_items)
    # by rows at any share: this table's 151 rows are fewer than a step's ids
    train = dataclasses.replace(
        TRAIN,
        hardware=dataclasses.replace(TRAIN.hardware, device=device, precision="fp32"),
        distributed=DistributedConfig(row_sparse_below=workers.world_size),
    )
    result = fit(model, data, train, EVAL, recipe_of(model, data, SAMPLED))
    if workers.is_main:
        torch.save({"gradients": gradients, "weights": model.state_dict(), "best_valid": result.best_valid}, out)
    leave()


def reduce_touched_rows(out: str, dense_above: float, expected_rows: int) -> None:
    """`RowSparseReduction` of a 10 x 4 table whose gradient holds 3 rows on each process (rows 0, 3, 5 weighted 1 on
    the first, 1, 4, 6 weighted 2 on the second), told to expect `expected_rows`: the first process writes the
    averaged gradient and whether the epoch's check refused it."""
    torch.set_num_threads(1)
    workers = join(torch.device("cpu"))
    table = nn.Parameter(torch.zeros(10, 4))
    reduction = RowSparseReduction(table, workers, lambda: True, dense_above=dense_above)
    reduction.expect(expected_rows)
    (table[torch.tensor([0, 3, 5]) + workers.rank] * (workers.rank + 1)).sum().backward()
    try:
        reduction.check()
        refused = False
    except RuntimeError:
        refused = True
    if workers.is_main:
        torch.save({"gradient": table.grad, "refused": refused}, out)
    leave()


def _rows_held(data: SequenceData, workers: Workers) -> list[int]:
    """The item rows each process holds of a sharded table."""
    model = small_sasrec(data.num_items)
    shard_item_table(model, workers, torch.device("cpu"))
    assert isinstance(model.item_emb.weight, DTensor)
    return [int(rows) for rows in gather_rows(torch.tensor([model.item_emb.weight.to_local().shape[0]]), workers)]


def train_and_save(data_dir: str, out: str, device: str = "cpu") -> None:
    """One step's gradients, then two epochs of training, of a small SASRec on `data_dir` (on `device`: "cpu" under
    gloo, "cuda" under NCCL); the first process writes the gradients, trained weights and test ranks to `out`."""
    torch.set_num_threads(1)
    data = load_prepared(Path(data_dir))
    workers = join(torch.device(device))
    gradients = first_step_gradients(data, workers, workers.device(torch.device(device)))
    model = small_sasrec(data.num_items)
    train = dataclasses.replace(TRAIN, hardware=dataclasses.replace(TRAIN.hardware, device=device, precision="fp32"))
    result = fit(model, data, train, EVAL, recipe_of(model, data))
    test = evaluate(model, data.eval_split("test"), data.num_items, EVAL, workers=workers)
    if workers.is_main:
        weights = {name: tensor.cpu() for name, tensor in model.state_dict().items()}
        torch.save({"gradients": gradients, "weights": weights, "ranks": test.ranks,
                    "metrics": test.metrics, "best_valid": result.best_valid}, out)  # fmt: skip
    leave()


def train_resumably(data_dir: str, state: str, out: str, epochs: int, die_at_batch: int = 0) -> None:
    """Train a small SASRec for `epochs` epochs on `data_dir` from the training state `state` (saving it after each
    epoch); the first process writes the epochs it trained and its weights to `out`. With `die_at_batch` = K > 0,
    the last process of the launcher's first attempt dies at its K-th batch (a killed process; the launcher
    restarts every process)."""
    torch.set_num_threads(1)
    data = load_prepared(Path(data_dir))
    workers = join(torch.device("cpu"))
    model = small_sasrec(data.num_items)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if die_at_batch and first_attempt and workers.rank == workers.world_size - 1:
        model.register_forward_pre_hook(_dying_at(die_at_batch))  # a hook: not part of what the run key hashes
    trained: list[int] = []
    config = dataclasses.replace(TRAIN, schedule=dataclasses.replace(TRAIN.schedule, epochs=epochs))
    fit(model, data, config, EVAL, recipe_of(model, data), on_epoch_end=lambda epoch, _: trained.append(epoch),
        state_path=Path(state))  # fmt: skip
    if workers.is_main:
        torch.save({"trained": trained, "weights": model.state_dict()}, out)
    leave()


def _dying_at(batch: int) -> Callable[..., None]:
    """A forward pre-hook that exits its process at once, as a kill does, at the `batch`-th training forward."""
    calls = 0

    def hook(module: nn.Module, *_: Any) -> None:
        nonlocal calls
        calls += module.training  # training batches, not validation's
        if calls == batch:
            os._exit(9)

    return hook


def host_sums_and_a_sharded_step(data_dir: str, out: str) -> None:
    """`reduce_on_hosts` of each process's integers, and one training step of a SASRec of 20,000 items (dim 32) whose
    table is split by rows, under the profiler: the largest single allocation of the step. The first process writes
    both to `out`."""
    torch.set_num_threads(1)
    data = load_prepared(Path(data_dir))
    workers = join(torch.device("cpu"))
    sums = reduce_on_hosts([workers.rank + 1, 10 * workers.rank])
    largest = reduce_on_hosts([3 + workers.rank, -workers.rank], "max")
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=20_000, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.0,
                                attn_dropout=0.0))  # fmt: skip
    recipe = recipe_of(model, data, SAMPLED)
    shard_item_table(model, workers, torch.device("cpu"))
    step_loss = DataParallelLoss(model, recipe, workers, find_unused_parameters=False)
    generator = torch.Generator().manual_seed(TRAIN.seed)
    batch = next(batch for rows in data.training_epoch(generator) for batch in recipe.batches(rows, generator))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        loss, _, _ = step_loss(batch, generator)
        loss.backward()
    allocated = max(event.cpu_memory_usage for event in profile.events() if event.name == "aten::empty")
    if workers.is_main:
        torch.save({"sums": sums, "largest": largest, "largest_allocation": allocated}, out)
    leave()


GENERATIVE_ITEMS = 100


def generative_batch() -> HistoryBatch:
    """A fixed batch of 6 histories of 8 items for the tiny generative retriever (targets, user buckets 1-5)."""
    generator = torch.Generator().manual_seed(0)
    return HistoryBatch(torch.randint(1, GENERATIVE_ITEMS + 1, (6, 8), generator=generator),
                        torch.randint(1, GENERATIVE_ITEMS + 1, (6,), generator=generator),
                        torch.randint(1, 6, (6,), generator=generator))  # fmt: skip


def generative_step_gradients(workers: Workers, compiled: bool) -> dict[str, torch.Tensor]:
    """The gradients of one step of the tiny generative retriever on `generative_batch` (on several processes, this
    one's share of it, averaged by DDP); `compiled`: its loss compiled with the forward as the trainer compiles it
    (backend aot_eager: the graphs and autograd inductor would get, without its code generation)."""
    model = tiny_generative(GENERATIVE_ITEMS).train()
    step_loss = DataParallelLoss(model, GenerativeRecipe(max_history=8, batch_size=6), workers,
                                 find_unused_parameters=False)  # fmt: skip
    if compiled:
        compile_model(model, backend="aot_eager")  # the trainer's order: the forward (validation's), then the loss
        step_loss.compile("default", backend="aot_eager")
    loss, _, _ = step_loss(generative_batch(), torch.Generator().manual_seed(1))
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def compiled_generative_step_gradients(out: str) -> int:
    """`generative_step_gradients` compiled, on this process of a gloo run; the first process writes the gradients to
    `out`. Returns the graphs this process compiled."""
    torch.set_num_threads(1)
    workers = join(torch.device("cpu"))
    gradients = generative_step_gradients(workers, compiled=True)
    if workers.is_main:
        torch.save(gradients, out)
    graphs = compiled_graphs()
    leave()
    return graphs
