"""Data-parallel training on 1 and N processes of one host: tokens/s, scaling efficiency and peak memory per process
with the item table replicated vs split by rows; and Beauty's SASRec trained on 1 and N processes (test NDCG@10).

Usage:
    .venv/bin/python -m benchmarks.distributed                      # on a host with 2 GPUs (NCCL)
    .venv/bin/python -m benchmarks.distributed --config configs/benchmarks/distributed-smoke.yaml   # CPU, gloo

Settings: configs/benchmarks/distributed.yaml (`--config`, `--set KEY=VALUE`).

Throughput (section "throughput"): the synthetic data set of `users` x `items` (`features.synthetic`, prepared into
`data_dir` unless it is there) feeds each model of `models` (SASRec, HSTU at `dim`, the sampled softmax with
`num_negatives` shared negatives) through the trainer's own step (`recsys.training.trainer.train_one_epoch`, the
data-parallel loss): `warmup_steps` steps, then `timed_steps` timed, on 1 process and on `processes`, each process
taking `rows_per_process` packed rows of every batch (weak scaling: N processes train N times the rows per step).
tokens/s counts the targets of every process; scaling efficiency = tokens/s on N / (N * tokens/s on 1). Each
configuration runs in its own processes, started by torch's elastic launcher; peak memory is each process's
(`torch.cuda.max_memory_allocated`, or its resident set on a CPU). With `row_sharded`, N processes also run with
the item table split by rows (`train.shard_item_table`).

Beauty (section "beauty"): `beauty_config` trained by the pipeline's train step (`pipelines.train.train_step`,
tracking off) on 1 process and on `processes`, same config and seed: best validation epoch, valid and test NDCG@10.

Writes benchmarks/results/distributed-<device type>.json with the GPUs, world size, backend and versions.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from features.prepare import prepare
from features.sources import load_source, open_synthetic
from pipelines.config import load_config
from pipelines.train import train_step
from recsys.data.prepared import PreparedParts
from recsys.models.registry import build_model
from recsys.runtime.budget import peak_resident_gib
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.runtime.distributed import backend_for, gather_rows, join, leave
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.optimization import build_optimization
from recsys.training.recipes import NextItemTraining, recipe_for
from recsys.training.row_sharding import check_shardable, shard_item_table
from recsys.training.trainer import train_one_epoch

logger = logging.getLogger("benchmarks.distributed")


@dataclass(frozen=True)
class Settings:
    sections: tuple[str, ...] = ("throughput", "beauty")
    device: str = "cuda"
    processes: int = 2
    # throughput
    users: int = 100_000
    items: int = 1_000_000
    data_dir: str = ".cache/distributed/{users}x{items}"
    models: tuple[str, ...] = ("sasrec", "hstu")
    dim: int = 128
    max_history: int = 50
    num_layers: int = 2
    num_heads: int = 2
    num_negatives: int = 4096
    rows_per_process: int = 128
    warmup_steps: int = 10
    timed_steps: int = 50
    row_sharded: bool = True
    lr: float = 1e-3
    seed: int = 0
    # beauty
    beauty_config: str = "configs/beauty/sasrec.yaml"
    beauty_data: str = "../shared/data/amazon-beauty"
    beauty_overrides: dict[str, Any] = field(default_factory=dict)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "configs/benchmarks/distributed.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = resolve_device(settings.device)
    if device.type == "cuda" and torch.cuda.device_count() < settings.processes:
        raise SystemExit(f"{settings.processes} processes on CUDA need as many GPUs; this host has "
                         f"{torch.cuda.device_count()}. Fix: --set processes=N, or --set device=cpu")  # fmt: skip
    out: dict[str, Any] = {
        "settings": asdict(settings),
        "device": device.type,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world_sizes": [1, settings.processes],
        "backend": backend_for(device),
    }
    with tempfile.TemporaryDirectory() as scratch:
        if "throughput" in settings.sections:
            out["throughput"] = _throughput(settings, Path(scratch))
        if "beauty" in settings.sections:
            out["beauty"] = _beauty(settings, Path(scratch))
    out.update(provenance())
    path = write_result(f"distributed-{device.type}", out, args.results_dir, reproduce)
    print(json.dumps({k: out[k] for k in ("throughput", "beauty") if k in out}, indent=1), f"-> {path}", sep="\n")
    return path


def _launch(processes: int, entry: Any, *arguments: Any) -> None:
    """`entry(*arguments)` on `processes` processes of this host, started by torch's elastic launcher."""
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
        rdzv_endpoint="localhost:0", max_restarts=0, start_method="spawn", monitor_interval=0.1,
    )  # fmt: skip
    elastic_launch(config, entry)(*arguments)


def _throughput(settings: Settings, scratch: Path) -> dict[str, Any]:
    data_dir = Path(settings.data_dir.format(users=settings.users, items=settings.items))
    if not (data_dir / "meta.json").is_file():
        prepare(open_synthetic(num_users=settings.users, num_items=settings.items, seed=settings.seed), data_dir)
    runs = [(1, False), (settings.processes, False)] + ([(settings.processes, True)] if settings.row_sharded else [])
    results: dict[str, Any] = {}
    for model in settings.models:
        rows = []
        for processes, sharded in runs:
            report = scratch / f"{model}-{processes}-{sharded}.json"
            _launch(processes, _train_steps, asdict(settings), str(data_dir), model, sharded, str(report))
            rows.append(json.loads(report.read_text()))
            logger.info("%s", rows[-1])
        single = rows[0]["tokens_per_second"]
        for row in rows[1:]:
            row["scaling_efficiency"] = significant(row["tokens_per_second"] / (row["processes"] * single))
        results[model] = rows
    return results


def _train_steps(settings_dict: dict[str, Any], data_dir: str, model_name: str, sharded: bool, report: str) -> None:
    """One process of a throughput run: warm-up steps, then timed steps; the first process writes the report."""
    settings = Settings(**settings_dict)
    device = resolve_device(settings.device)
    workers = join(device)
    device = workers.device(device)
    parts = PreparedParts.open(Path(data_dir), buffer_parts=4)
    torch.manual_seed(settings.seed)
    params = {"max_history": settings.max_history, "dim": settings.dim, "num_layers": settings.num_layers,
              "num_heads": settings.num_heads, "dropout": 0.0}  # fmt: skip
    if model_name == "sasrec":
        params["ffn_dim"] = 4 * settings.dim
    model = build_model(model_name, params, parts.num_items)
    training = NextItemTraining(loss="sampled_softmax", num_negatives=settings.num_negatives)
    recipe = recipe_for(model, parts, settings.rows_per_process * workers.world_size, training)
    if sharded:
        check_shardable(model, recipe)
        shard_item_table(model, workers, device)
    model.to(device)
    optimization = build_optimization(model, lr=settings.lr, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                      total_steps=0, fused=device.type == "cuda")  # fmt: skip
    loss_of = DataParallelLoss(model, recipe, workers, find_unused_parameters=False)
    generator = torch.Generator().manual_seed(settings.seed)
    steps = settings.warmup_steps + settings.timed_steps
    batches = []
    for rows in parts.training_epoch(generator):
        batches += recipe.batches(rows, generator)
        if len(batches) >= steps:
            break
    if len(batches) < steps:
        raise SystemExit(f"the data gives {len(batches)} batches, fewer than {steps} steps. Fix: more users")
    bf16 = use_bf16_autocast("auto", device)

    def run(chunk: list[Any]) -> float:
        _synchronize(device)
        start = time.perf_counter()
        train_one_epoch(model, loss_of, chunk, optimization, bf16, False, generator)
        _synchronize(device)
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run(batches[: settings.warmup_steps])
    seconds = run(batches[settings.warmup_steps : steps])
    tokens = sum(int((batch.targets != 0).sum()) for batch in batches[settings.warmup_steps : steps])
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else peak_resident_gib()
    peaks = [float(p) for p in gather_rows(torch.tensor([peak], dtype=torch.float64), workers)]
    if workers.is_main:
        table = "row_sharded" if sharded else "replicated"
        Path(report).write_text(json.dumps({
            "model": model_name, "processes": workers.world_size, "item_table": table,
            "rows_per_step": settings.rows_per_process * workers.world_size, "timed_steps": settings.timed_steps,
            "tokens_per_second": significant(tokens / seconds),
            "seconds_per_step": significant(seconds / settings.timed_steps),
            "peak_memory_gib_per_process": [significant(p) for p in peaks],
            "memory": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak resident set",
        }))  # fmt: skip
    leave()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _beauty(settings: Settings, scratch: Path) -> dict[str, Any]:
    data_dir = scratch / "beauty"
    prepare(load_source("amazon-p5", Path(settings.beauty_data)), data_dir)
    runs = {}
    for processes in (1, settings.processes):
        report = scratch / f"beauty-{processes}.json"
        if processes == 1:
            _train_beauty(asdict(settings), str(data_dir), str(scratch / "beauty-1"), str(report))
        else:
            _launch(processes, _train_beauty, asdict(settings), str(data_dir), str(scratch / "beauty-n"), str(report))
        runs[str(processes)] = json.loads(report.read_text())
    one, many = runs["1"]["test ndcg@10"], runs[str(settings.processes)]["test ndcg@10"]
    return {"config": settings.beauty_config, "overrides": settings.beauty_overrides, "runs": runs,
            "test ndcg@10 relative difference": significant(many / one - 1)}  # fmt: skip


def _train_beauty(settings_dict: dict[str, Any], data_dir: str, out_dir: str, report: str) -> None:
    """The pipeline's train step of the Beauty config (tracking off); the first process writes the report."""
    settings = Settings(**settings_dict)
    overrides = {**settings.beauty_overrides, "train.device": settings.device, "tracking.enabled": False}
    config = load_config(REPO / settings.beauty_config, overrides)
    start = time.perf_counter()
    outputs = train_step(config, Path(data_dir), Path(out_dir))
    workers = join(resolve_device(settings.device))
    if workers.is_main:
        metrics = outputs.metrics
        Path(report).write_text(json.dumps({
            "processes": workers.world_size, "wall_seconds": significant(time.perf_counter() - start),
            "best_epoch": metrics.get("best_epoch"), "valid ndcg@10": significant(metrics["valid"]["ndcg@10"]),
            "test ndcg@10": significant(metrics["test"]["ndcg@10"]),
            "test recall@10": significant(metrics["test"]["recall@10"]),
        }))  # fmt: skip
    leave()


if __name__ == "__main__":
    main()
