"""Sharded sparse features: torchrec's DistributedModelParallel (DMP) spreads a model's embedding tables over the run's
processes, with a plan made by torchrec's EmbeddingShardingPlanner.

What is sharded: the torchrec `EmbeddingBagCollection`s a model holds in `OrderedEmbeddingBags` (the two-tower's
sparse features with `model.shard_tables`). "table_wise" puts each whole table on one process (the planner balances
them); "row_wise" splits every table's rows over all processes. Each process still looks up its own share of the
batch: the sharded collection sends every id to the process holding its row (an all-to-all of the KeyedJaggedTensor)
and the pooled vectors back, so the model's KJT input is unchanged. DMP wraps the rest of the model (the towers' MLPs)
in DDP, and the step is `DataParallelLoss`'s: each process weighs its share's loss by n_rank * N / n_batch; DDP
averages the dense gradients, and torchrec divides the tables' gradients by the process count in the all-to-all's
backward (`torchrec.distributed.comm_ops.get_gradient_division`), so 2 sharded processes make the update 1 process
makes from the same shares (tests/recsys/training/test_model_parallel.py).

The tables train with fbgemm's optimizer fused into the backward pass (`fused`, the one compute kernel torchrec's
planner allows for sharded tables): `model.table_optimizer` at `model.table_lr` (row-wise Adagrad by default; SGD,
Adagrad, and on CUDA Adam), updating the rows a step read. The rest of the model trains with the run's optimizer.
Learning-rate schedules, weight decay, gradient accumulation and the weight average do not reach the fused update
and are refused (`table_training`).

Where: CPU processes under gloo shard table-wise (torchrec's planner offers no row-wise sharding on CPU; a hand-made
row-wise plan runs forward there, but its backward needs every process to look up the same batch size, which a batch's
shares do not); CUDA processes shard either way, with fbgemm's CUDA build (`require_cuda_fbgemm`). Evaluation and the
model written at the end read whole tables: `gathered_tables` and `unshard_tables` gather them on every process.

Example (planning needs no process group, and no GPU for a CUDA plan):
    >>> from recsys.models.two_tower import TwoTower, TwoTowerConfig
    >>> model = TwoTower(TwoTowerConfig(num_items=100, dim=8, shard_tables="row_wise"))
    >>> for table in placements(plan_tables(model, "row_wise", world_size=2, compute_device="cuda")):
    ...     print(table)
    item_features.bags.item_id: row_wise (fused) on ranks [0, 1]
    user_features.bags.history: row_wise (fused) on ranks [0, 1]
    user_features.bags.recent: row_wise (fused) on ranks [0, 1]
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from recsys.errors import ConfigError
from recsys.modules.table_training import Sharding, TableTraining
from recsys.runtime.distributed import Workers, from_main, sum_over_workers
from recsys.training.config import OptimizationConfig
from recsys.training.data_parallel import DataParallelLoss, LossModule
from recsys.training.recipes import Recipe

if TYPE_CHECKING:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingPlan

    from recsys.modules.ordered_embedding_bags import OrderedEmbeddingBags

logger = logging.getLogger(__name__)

_FUSED: dict[str, dict[str, Any]] = {  # fbgemm's optimizers (EmbOptimType); Adam's betas and eps: torch's
    "rowwise_adagrad": {"optimizer": "EXACT_ROWWISE_ADAGRAD"},
    "adagrad": {"optimizer": "EXACT_ADAGRAD"},
    "sgd": {"optimizer": "EXACT_SGD"},
    "adam": {"optimizer": "ADAM", "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
}
_ON_CPU = ("rowwise_adagrad", "adagrad", "sgd")  # what fbgemm's CPU kernels fuse


@runtime_checkable
class ShardedTablesModel(Protocol):
    """A model whose sparse tables a distributed run may shard (`recsys.modules.table_training`)."""

    def table_training(self) -> TableTraining | None:
        """How its tables shard and train; None: they are not sharded."""
        ...


def table_training(model: nn.Module, train: OptimizationConfig) -> TableTraining | None:
    """What `model` asks of its tables (None: no sharding), checked against the run's optimization settings.

    Raises:
        ConfigError: a training setting the fused table update cannot follow.
    """
    tables = model.table_training() if isinstance(model, ShardedTablesModel) else None
    if tables is None:
        return None
    unfollowed = {
        "train.optimization.lr_schedule: constant": train.lr_schedule != "constant",
        "train.optimization.warmup_steps: 0": train.warmup_steps > 0,
        "train.optimization.weight_decay: 0": train.weight_decay > 0,
        "train.optimization.accumulate_batches: 1": train.accumulate_batches > 1,
        "train.optimization.ema_decay: 0": train.ema_decay > 0,
    }
    asked = [setting for setting, differs in unfollowed.items() if differs]
    if asked:
        raise ConfigError(
            f"model.shard_tables={tables.sharding} updates the tables with fbgemm's optimizer inside the backward "
            f"pass, which has no schedule, weight decay, accumulation or average. Fix: set {', '.join(asked)}, or "
            "model.shard_tables: none"
        )
    return tables


def check_sharding(tables: TableTraining, device: torch.device) -> None:
    """Raise a ConfigError when `tables` cannot train on processes of `device`'s type."""
    if device.type == "cuda":
        require_cuda_fbgemm()
        return
    if tables.sharding == "row_wise":
        raise ConfigError(
            "model.shard_tables=row_wise on CPU processes: torchrec shards tables by rows on CUDA only (its planner "
            "offers table_wise and column-wise sharding on CPU, and a hand-made row-wise plan fails in the backward "
            "pass there unless every process looks up the same batch size). Fix: model.shard_tables=table_wise on "
            "CPU processes, or train on GPUs"
        )
    if tables.optimizer not in _ON_CPU:
        raise ConfigError(
            f"model.table_optimizer={tables.optimizer} on CPU processes: fbgemm's CPU kernels fuse "
            f"{', '.join(_ON_CPU)} only. Fix: model.table_optimizer: rowwise_adagrad (with model.table_lr), or train "
            "on GPUs"
        )


def require_cuda_fbgemm() -> None:
    """Raise a ConfigError unless fbgemm's CUDA ops are installed: torchrec's sharded modules run on them, and the CPU
    build (fbgemm-gpu-cpu) imports fine on a GPU machine but fails on the first CUDA tensor."""
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    try:
        torch.ops.fbgemm.asynchronous_complete_cumsum(torch.ones(1, dtype=torch.long, device="cuda"))
    except (NotImplementedError, RuntimeError, AssertionError) as err:
        builds = {name: _installed(name) for name in ("fbgemm-gpu", "fbgemm-gpu-cpu")}
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"model.shard_tables on CUDA needs fbgemm's CUDA build; this environment has {builds} and fbgemm's ops "
            f"refuse CUDA tensors ({first_line}). Fix: run `make setup` on this machine (it installs the `cuda` extra, "
            "fbgemm-gpu pinned to this torch, when nvidia-smi lists a GPU), or by hand: "
            "`.venv/bin/pip uninstall -y fbgemm-gpu-cpu && .venv/bin/pip install -e '.[cuda]'`; or train on CPU "
            "processes (train.hardware.device: cpu) with model.shard_tables=table_wise"
        ) from err


def _installed(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class PlacedTable:
    """Where a plan puts one table."""

    module: str  # the collection's path in the planned module
    table: str
    sharding: str  # torchrec's ShardingType value
    kernel: str  # torchrec's EmbeddingComputeKernel value
    ranks: tuple[int, ...]  # the processes holding a part of it

    def __str__(self) -> str:
        return f"{self.module}.{self.table}: {self.sharding} ({self.kernel}) on ranks {list(self.ranks)}"


def table_sharder(tables: TableTraining) -> EmbeddingBagCollectionSharder:
    """torchrec's sharder of `EmbeddingBagCollection`s, with the tables' fused optimizer."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    fused = {**_FUSED[tables.optimizer], "learning_rate": tables.lr}
    return EmbeddingBagCollectionSharder(fused_params={**fused, "optimizer": EmbOptimType[fused["optimizer"]]})


def plan_tables(
    module: nn.Module,
    sharding: Sharding,
    world_size: int,
    compute_device: str,
    sharder: EmbeddingBagCollectionSharder | None = None,
) -> ShardingPlan:
    """torchrec's planner's plan for every `EmbeddingBagCollection` of `module`, each table constrained to `sharding`,
    over `world_size` processes of `compute_device` ("cpu" or "cuda"). Computed here, without a process group."""
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    names = [
        t.name for m in module.modules() if isinstance(m, EmbeddingBagCollection) for t in m.embedding_bag_configs()
    ]
    hosts = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))  # processes per host: the launcher's
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size, local_world_size=min(hosts, world_size)),
        kernel_config=KernelConfig(compute_device=compute_device),
    )
    constraints = {name: ParameterConstraints(sharding_types=[sharding]) for name in names}
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    return planner.plan(module, [sharder or EmbeddingBagCollectionSharder()])


def placements(plan: ShardingPlan) -> list[PlacedTable]:
    """Every table of `plan`: its collection, sharding type, compute kernel and ranks."""
    return [
        PlacedTable(path, table, spec.sharding_type, spec.compute_kernel, tuple(spec.ranks or ()))
        for path, module_plan in plan.plan.items()
        for table, spec in module_plan.items()
    ]


class ModelParallelLoss(DataParallelLoss):
    """`DataParallelLoss`'s step with the model's tables sharded by DMP over the run's processes (in place: the model's
    `OrderedEmbeddingBags` then hold torchrec's sharded collections, starting from the tables' current weights, updated
    by their fused optimizer in every backward pass).

    Args:
        model: the model being trained, already on this process's device.
        recipe: its batches and loss.
        workers: the run's processes (their process group started: one process's too, e.g. to time the fused update).
        tables: how the tables are placed and updated (`table_training`).

    Raises:
        ConfigError: the tables cannot train so on this device (`check_sharding`).
    """

    def __init__(self, model: nn.Module, recipe: Recipe, workers: Workers, tables: TableTraining) -> None:
        from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel

        device = next(model.parameters()).device
        check_sharding(tables, device)
        if not dist.is_initialized():
            raise ValueError("ModelParallelLoss needs a started process group (`recsys.runtime.distributed.join`)")
        self.workers = workers
        self.loss_module = LossModule(model, recipe)
        weights = {path: bags.bags.state_dict() for path, bags in _ordered_bags(model)}
        sharder = table_sharder(tables)
        # every process plans alike; taking the first one's plan makes them agree even if the planner did not
        plan = from_main(plan_tables(self.loss_module, tables.sharding, workers.world_size, device.type, sharder))
        self.placements = [dataclasses.replace(t, module=t.module.removeprefix("model.")) for t in placements(plan)]
        if workers.is_main:
            logger.info(
                "sharded tables (torchrec DMP over %d processes, %s at lr %g):\n  %s",
                workers.world_size, tables.optimizer, tables.lr, "\n  ".join(str(table) for table in self.placements),
            )  # fmt: skip
        # DataParallelLoss's DDP settings for the rest of the model (torchrec's default is a static graph)
        dense = DefaultDataParallelWrapper(static_graph=False, find_unused_parameters=recipe.may_skip_parameters)
        self.module = DistributedModelParallel(
            self.loss_module, device=device, plan=plan, sharders=[sharder], data_parallel_wrapper=dense
        )
        for path, bags in _ordered_bags(model):
            _copy_into_shards(bags.bags.state_dict(), weights[path])

    def table_optimizer_state(self) -> dict[str, Any]:
        """The fused table optimizer's state (e.g. Adagrad's accumulators, sharded as the tables are), keyed by table:
        what a training state saves, and the template it is loaded into."""
        state: dict[str, Any] = self.module.fused_optimizer.state_dict()  # type: ignore[union-attr]
        return state

    def load_table_optimizer_state(self, state: dict[str, Any]) -> None:
        """Load what `table_optimizer_state` gave, filled from a checkpoint (its tensors are the optimizer's own, filled
        in place; this sets the rest, e.g. the learning rate)."""
        self.module.fused_optimizer.load_state_dict(state)  # type: ignore[union-attr]


@contextlib.contextmanager
def gathered_tables(model: nn.Module) -> Iterator[None]:
    """Inside the block the model's sharded tables are whole on every process (plain torchrec collections, e.g. to
    score every item in evaluation); outside it, sharded again. Changes made inside are not written back. Nothing
    when no table is sharded; a collective per table when they are."""
    sharded = [(bags, bags.bags) for bags in _sharded_bags(model)]
    for bags, shards in sharded:
        bags.bags = _whole(shards, bags, _dense_device(model))
    try:
        yield
    finally:
        for bags, shards in sharded:
            bags.bags = shards


def unshard_tables(model: nn.Module) -> None:
    """Make the model's sharded tables plain torchrec collections again, whole on every process (the trained model:
    to evaluate, to write); a collective per table when they are sharded."""
    for bags in _sharded_bags(model):
        bags.bags = _whole(bags.bags, bags, _dense_device(model))


def fused_table_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of the model's sharded tables: their fused optimizer updates them in the backward pass, so the
    run's optimizer must leave them out (they never get a gradient, and their state would not be this process's)."""
    return [p for bags in _sharded_bags(model) for p in bags.parameters()]


def _sharded_bags(model: nn.Module) -> list[OrderedEmbeddingBags]:
    """The model's `OrderedEmbeddingBags` whose collection DMP has sharded (torchrec is only imported for a model whose
    config asks for sharded tables: it holds torchrec's modules already)."""
    if not isinstance(model, ShardedTablesModel) or model.table_training() is None:
        return []
    from torchrec.distributed.types import ShardedModule

    return [bags for _, bags in _ordered_bags(model) if isinstance(bags.bags, ShardedModule)]


def _ordered_bags(model: nn.Module) -> list[tuple[str, OrderedEmbeddingBags]]:
    from recsys.modules.ordered_embedding_bags import OrderedEmbeddingBags

    return [(path, module) for path, module in model.named_modules() if isinstance(module, OrderedEmbeddingBags)]


def _dense_device(model: nn.Module) -> torch.device:
    """Where the model's parameters outside its tables live: this process's device (the gathered tables go there)."""
    in_tables = {id(p) for _, bags in _ordered_bags(model) for p in bags.parameters()}
    dense = next((p for p in model.parameters() if id(p) not in in_tables), None)
    if dense is None:
        raise ValueError(f"{type(model).__name__} has no parameters outside its tables to tell its device by")
    return dense.device


def _shard_slices(shard: Any) -> tuple[slice, ...]:
    """The block of the whole table that a ShardedTensor's local shard holds."""
    offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
    return tuple(slice(start, start + size) for start, size in zip(offsets, sizes, strict=True))


def _copy_into_shards(sharded_state: dict[str, Any], whole_state: dict[str, torch.Tensor]) -> None:
    """Each local shard of `sharded_state` (ShardedTensors) takes its block of the whole tables `whole_state`."""
    with torch.no_grad():
        for key, sharded in sharded_state.items():
            for shard in sharded.local_shards():
                shard.tensor.copy_(whole_state[key][_shard_slices(shard)])


def _whole(shards: nn.Module, bags: OrderedEmbeddingBags, device: torch.device) -> nn.Module:
    """A plain `EmbeddingBagCollection` of `bags`' tables holding every process's blocks of `shards`."""
    from torchrec import EmbeddingBagCollection

    whole = EmbeddingBagCollection(bags.tables, device=torch.device("meta")).to_empty(device=device)
    target = whole.state_dict()
    with torch.no_grad():
        for key, sharded in shards.state_dict().items():
            blocks = torch.zeros(sharded.size(), dtype=sharded.dtype, device=device)
            for shard in sharded.local_shards():
                blocks[_shard_slices(shard)] = shard.tensor
            target[key].copy_(sum_over_workers(blocks))  # the blocks do not overlap: their sum is the table
    return whole
