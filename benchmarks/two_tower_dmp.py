"""Two-tower training step with torchrec DMP on CPU processes: samples/s of one process vs N gloo processes, and the
sharding plan the planner chose; writes JSON.

Usage:
    nice -n 10 .venv/bin/python -m benchmarks.two_tower_dmp
    .venv/bin/python -m benchmarks.two_tower_dmp --config benchmarks/configs/two-tower-dmp-smoke.yaml

Settings: benchmarks/configs/two-tower-dmp.yaml (`--config`, `--set KEY=VALUE`). A step is the trainer's: the
two-tower recipe's loss (in-batch + sampled negatives) of a batch of `batch_size` (history, target) rows over every
process (each takes rows rank::N), backward, the optimizer step. The model is the two-tower with torchrec's
EmbeddingBagCollection (`model.shard_tables`) in every variant. Variants:
    one_process      the tables replicated, no DMP: Adam (`build_optimization`) over every parameter
    one_process_dmp  DMP in a process group of one: the tables' fused update (`table_optimizer` on the rows a step
                     read, in the backward pass), Adam over the rest; what the N processes below divide
    data_parallel    N processes under DDP, the tables replicated: as one_process
    model_parallel   N processes under DMP, the tables sharded table-wise: as one_process_dmp
Every process runs `threads` torch threads. Timed: the median of `steps` steps after `warmup`, on
rank 0 (the collectives keep the processes in step). Also recorded: the plan DMP ran with, the row-wise plan the
planner makes for the same tables on N CUDA processes (planned here, not run: torchrec shards by rows on CUDA only),
and the machine's load average before the run. Writes benchmarks/results/two-tower-dmp-<label>.json.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.reproduce import jsonable, mismatches
from pipelines.launcher import run_on_processes
from recsys.data.batching import HistoryBatch
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.modules.table_training import TableOptimizer, TableTraining
from recsys.runtime.distributed import Workers, join, leave
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.model_parallel import ModelParallelLoss, PlacedTable, placements, plan_tables
from recsys.training.optimization import build_optimization
from recsys.training.recipes.pairs import TwoTowerRecipe

Variant = Literal["one_process", "one_process_dmp", "data_parallel", "model_parallel"]
DISTRIBUTED: tuple[Variant, ...] = ("data_parallel", "model_parallel")


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/two-tower-dmp.yaml)."""

    items: int  # V: rows of the history, recent and item-id tables (V+1 each)
    dim: int
    hidden_dim: int
    max_history: int
    batch_size: int  # rows per step over every process
    num_negatives: int  # uniformly drawn items beside the in-batch ones
    lr: float  # Adam's, of the dense part (and of the tables in the unsharded variants)
    table_optimizer: TableOptimizer  # the sharded tables' fused optimizer (model.table_optimizer)
    table_lr: float
    processes: int  # of the distributed variants (gloo)
    threads: int  # torch threads of every process (1 process x T threads vs N processes x T threads)
    warmup: int  # untimed steps
    steps: int  # timed steps (median)
    variants: tuple[Variant, ...]
    label: str  # the result is two-tower-dmp-<label>.json


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def two_tower(s: Settings) -> TwoTower:
    torch.manual_seed(0)
    config = TwoTowerConfig(num_items=s.items, max_history=s.max_history, user_tower="pooled", dim=s.dim,
                            hidden_dim=s.hidden_dim, shard_tables="table_wise")  # fmt: skip
    return TwoTower(config)


def recipe(s: Settings) -> TwoTowerRecipe:
    uniform = torch.full((s.items + 1,), -math.log(s.items))
    return TwoTowerRecipe(s.max_history, s.batch_size, uniform, s.num_negatives, torch.arange(1, s.items + 1))


def batches(s: Settings) -> Iterator[HistoryBatch]:
    """Full histories of uniformly drawn items (the same on every process: each takes its share)."""
    generator = torch.Generator().manual_seed(0)
    while True:
        histories = torch.randint(1, s.items + 1, (s.batch_size, s.max_history), generator=generator)
        targets = torch.randint(1, s.items + 1, (s.batch_size,), generator=generator)
        yield HistoryBatch(histories, targets, torch.arange(1, s.batch_size + 1))


def median_step_seconds(model: TwoTower, loss_of: DataParallelLoss, s: Settings, workers: Workers) -> float:
    optimization = build_optimization(model, lr=s.lr, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                      total_steps=1, fused=False)  # fmt: skip
    generator = torch.Generator().manual_seed(workers.rank)
    times = []
    for step, batch in zip(range(s.warmup + s.steps), batches(s), strict=False):
        start = time.perf_counter()
        loss, _, _ = loss_of(batch, generator)
        loss.backward()
        optimization.step()
        optimization.zero_grad()
        if step >= s.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_one_process(s: Settings) -> float:
    torch.set_num_threads(s.threads)
    model = two_tower(s)
    loss_of = DataParallelLoss(model, recipe(s), Workers(), find_unused_parameters=False)
    return median_step_seconds(model, loss_of, s, Workers())


def time_one_process_dmp(s: Settings, work_dir: Path) -> float:
    """DMP in a process group of one: the tables' fused update without the sharding (what 2 processes divide)."""
    torch.set_num_threads(s.threads)
    dist.init_process_group("gloo", store=dist.FileStore(str(work_dir / "store"), 1), rank=0, world_size=1)
    try:
        model = two_tower(s)
        loss_of = ModelParallelLoss(
            model, recipe(s), Workers(), TableTraining("table_wise", s.table_optimizer, s.table_lr)
        )
        return median_step_seconds(model, loss_of, s, Workers())
    finally:
        leave()


def time_distributed(s: Settings) -> dict[str, Any]:
    """One of the launcher's processes: each distributed variant's median step, and the plan DMP ran with."""
    torch.set_num_threads(s.threads)
    workers = join(torch.device("cpu"))
    out: dict[str, Any] = {}
    for variant in (v for v in s.variants if v in DISTRIBUTED):
        model = two_tower(s)
        loss_of: DataParallelLoss
        if variant == "model_parallel":
            tables = TableTraining("table_wise", s.table_optimizer, s.table_lr)
            sharded = ModelParallelLoss(model, recipe(s), workers, tables)
            out["plan"], loss_of = sharded.placements, sharded
        else:
            loss_of = DataParallelLoss(model, recipe(s), workers, find_unused_parameters=False)
        out[variant] = median_step_seconds(model, loss_of, s, workers)
    leave()
    return out


def launch(s: Settings) -> dict[str, Any]:
    result: dict[str, Any] = run_on_processes(s.processes, time_distributed, s)[0]
    return result


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/two-tower-dmp.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    load_before = os.getloadavg()[0]  # a busy shared machine slows every variant: the result says how busy
    seconds: dict[str, float] = {}
    if "one_process" in s.variants:
        seconds["one_process"] = time_one_process(s)
    if "one_process_dmp" in s.variants:
        with tempfile.TemporaryDirectory() as work_dir:
            seconds["one_process_dmp"] = time_one_process_dmp(s, Path(work_dir))
    ran_plan: list[PlacedTable] = []
    if any(v in DISTRIBUTED for v in s.variants):
        timed = launch(s)
        ran_plan = timed.pop("plan", [])
        seconds |= timed
    row_wise = placements(plan_tables(two_tower(s), "row_wise", s.processes, "cuda"))
    runs = {variant: _run_record(variant, seconds, s) for variant in s.variants}
    for variant, run in runs.items():
        print(f"{variant:>15}: {run['processes']} process(es) x {run['threads_per_process']} threads, "
              f"{run['median_step_ms']:.1f} ms/step, {run['samples_per_s']:,.0f} samples/s")  # fmt: skip
    print("plan (ran, table_wise on CPU):\n  " + "\n  ".join(map(str, ran_plan)))
    print(f"plan (row_wise on {s.processes} CUDA processes, planned only):\n  " + "\n  ".join(map(str, row_wise)))
    result = {
        "settings": asdict(s),
        "device": "cpu",
        "world_size": s.processes,
        "backend": "gloo",
        "load_average_1m_before": round(load_before, 2),
        "runs": runs,
        "plans": {
            "table_wise_cpu_ran": [asdict(t) for t in ran_plan],
            "row_wise_cuda_planned_only": [asdict(t) for t in row_wise],
        },
        **provenance("torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu"),
    }
    path = write_result(f"two-tower-dmp-{s.label}", result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


def _run_record(variant: Variant, seconds: dict[str, float], s: Settings) -> dict[str, Any]:
    processes = s.processes if variant in DISTRIBUTED else 1
    record: dict[str, Any] = {
        "processes": processes,
        "backend": None if variant == "one_process" else "gloo",
        "threads_per_process": s.threads,
        "median_step_ms": significant(seconds[variant] * 1e3),
        "samples_per_s": significant(s.batch_size / seconds[variant]),
    }
    if "one_process" in seconds:
        record["speedup_vs_one_process"] = significant(seconds["one_process"] / seconds[variant], 3)
    return record


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (every setting, the world size, the variants run) that differs from
    `settings`."""
    recorded = {"settings": result.get("settings"), "world_size": result.get("world_size"),
                "variants": list(result.get("runs", {}))}  # fmt: skip
    expected = {"settings": jsonable(asdict(settings)), "world_size": settings.processes,
                "variants": list(settings.variants)}  # fmt: skip
    yield from mismatches(recorded, expected)


if __name__ == "__main__":
    main()
