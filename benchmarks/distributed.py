"""Data-parallel training on 1 and N processes of one host: tokens/s, scaling efficiency and peak memory per process
with the item table replicated vs split by rows; and Beauty's SASRec trained on 1 and N processes (test NDCG@10).

Usage:
    .venv/bin/python -m benchmarks.distributed                      # on a host with 2 GPUs (NCCL)
    .venv/bin/python -m benchmarks.distributed --config benchmarks/configs/distributed-smoke.yaml   # CPU, gloo

Settings: benchmarks/configs/distributed.yaml (`--config`, `--set KEY=VALUE`).

Throughput (section "throughput"): the synthetic data set of `users` x `items` (`features.synthetic`, prepared into
`data_dir` unless it is there) feeds each model of `models` (SASRec, HSTU at `dim`, the sampled softmax with
`num_negatives` shared negatives) through the trainer's own step (`recsys.training.trainer.train_one_epoch`, the
data-parallel loss): `warmup_steps` steps, then `timed_steps` timed, on 1 process, on each count of `between` and on
`processes`, each process taking `rows_per_process` packed rows of every batch (weak scaling: N processes train N
times the rows per step).
The batches are read from the prepared parts and packed as the steps ask for them, as in training, so the timed
steps include that work (every process packs every batch: `read_and_pack_share` is its share of the time).
tokens/s counts the targets of every process; scaling efficiency = tokens/s on N / (N * tokens/s on 1). Each
configuration runs in its own processes, started by torch's elastic launcher; peak memory is each process's
(`torch.cuda.max_memory_allocated`, or its resident set on a CPU). With `row_sharded`, N processes also run with
the item table split by rows (`train.shard_item_table`).

Largest catalogue (section "largest", GPUs only): SASRec's peak memory per GPU at `items` and 2 x `items` on 1 GPU
(table replicated) and on `processes` (split by rows) gives the cost of an item; the catalogue that fills
`memory_fraction` of a GPU is predicted from it, and a model of 90 % of that size trains a few steps to check it fits.

All-reduce (section "allreduce"): the collective a replicated item table adds to every step, alone: DDP's all-reduce
of a gradient the size of the table (`items` x `dim`, fp32) on `processes`, `warmup_steps` then `timed_steps` timed;
its time per call and bus bandwidth (NCCL's convention: bytes x 2 (N - 1) / N per second), to set beside the steps.

Beauty (section "beauty"): `beauty_config` trained by the pipeline's train step (`pipelines.train.train_step`,
tracking off) on 1 process and on `processes`, same config and seed: best validation epoch, valid and test NDCG@10.

Writes benchmarks/results/<result_name>.json (`distributed-<device type>` unless the config names it) with the GPUs,
world size, backend and versions.
"""

from __future__ import annotations

import itertools
import json
import logging
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.train_scale import BatchCounter
from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source, open_synthetic
from pipelines.config import load_config
from pipelines.launcher import run_on_processes
from pipelines.train import train_step
from recsys.data.prepared import PreparedParts
from recsys.models.registry import build_model
from recsys.runtime.budget import peak_resident_gib
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.runtime.distributed import backend_for, gather_rows, join, leave
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.optimization import build_optimization
from recsys.training.recipes import NextItemTraining, recipe_for
from recsys.training.recipes.next_item import NextItemRecipe
from recsys.training.row_sharding import check_shardable, shard_item_table
from recsys.training.trainer import train_one_epoch

logger = logging.getLogger("benchmarks.distributed")


@dataclass(frozen=True)
class Settings:
    sections: tuple[str, ...] = ("throughput", "largest", "beauty")  # and "allreduce"
    result_name: str = "distributed-{device}"  # benchmarks/results/<result_name>.json; {device}: cuda or cpu
    device: str = "cuda"
    processes: int = 2
    # throughput: also on these process counts between 1 and `processes` (e.g. [2] on a 4-GPU host: 1, 2 and 4)
    between: tuple[int, ...] = ()
    # throughput
    users: int = 100_000
    items: int = 1_000_000
    data_dir: str = ".cache/distributed/{users}x{items}"
    partitions: int = 16  # parts of the prepared data, read `buffer_parts` at a time: the timed steps read and pack
    buffer_parts: int = 1
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
    # largest: the share of a GPU's memory the predicted catalogue fills
    memory_fraction: float = 0.9
    lr: float = 1e-3
    seed: int = 0
    # beauty
    beauty_config: str = "configs/beauty/sasrec.yaml"
    beauty_data: str = "../shared/data/amazon-beauty"
    beauty_overrides: dict[str, Any] = field(default_factory=dict)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/distributed.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = resolve_device(settings.device)
    if device.type == "cuda" and torch.cuda.device_count() < settings.processes:
        raise SystemExit(f"{settings.processes} processes on CUDA need as many GPUs; this host has "
                         f"{torch.cuda.device_count()}. Fix: --set processes=N, or --set device=cpu")  # fmt: skip
    out: dict[str, Any] = {
        "settings": asdict(settings),
        "device": device.type,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world_sizes": _world_sizes(settings),
        "backend": backend_for(device),
    }
    with tempfile.TemporaryDirectory() as scratch:
        if "throughput" in settings.sections:
            out["throughput"] = _throughput(settings, Path(scratch))
        if "largest" in settings.sections:
            out["largest"] = _largest(settings, Path(scratch))
        if "allreduce" in settings.sections:
            out["allreduce"] = _allreduce(settings, Path(scratch))
        if "beauty" in settings.sections:
            out["beauty"] = _beauty(settings, Path(scratch))
    out.update(provenance())
    path = write_result(settings.result_name.format(device=device.type), out, args.results_dir, reproduce)
    shown = {k: out[k] for k in ("throughput", "largest", "allreduce", "beauty") if k in out}
    print(json.dumps(shown, indent=1), f"-> {path}", sep="\n")
    return path


def _synthetic_data(settings: Settings) -> Path:
    data_dir = Path(settings.data_dir.format(users=settings.users, items=settings.items))
    if not (data_dir / "meta.json").is_file():
        source = open_synthetic(num_users=settings.users, num_items=settings.items, seed=settings.seed)
        prepare(source, data_dir, PrepareSettings(partitions=settings.partitions))
    return data_dir


def _run(settings: Settings, data_dir: Path, scratch: Path, model: str, processes: int, sharded: bool,
         items: int | None = None, steps: tuple[int, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """One configuration on its own processes: its report."""
    report = scratch / f"{model}-{processes}-{sharded}-{items}.json"
    warmup, timed = steps or (settings.warmup_steps, settings.timed_steps)
    arguments = (asdict(settings), str(data_dir), model, sharded, items, warmup, timed, str(report))
    run_on_processes(processes, _train_steps, *arguments)
    row: dict[str, Any] = json.loads(report.read_text())
    logger.info("%s", row)
    return row


def _throughput(settings: Settings, scratch: Path) -> dict[str, Any]:
    data_dir = _synthetic_data(settings)
    sizes = _world_sizes(settings)
    runs = [(n, False) for n in sizes] + ([(n, True) for n in sizes[1:]] if settings.row_sharded else [])
    results: dict[str, Any] = {}
    for model in settings.models:
        # a catalogue of `items` even where the interactions reach fewer of them: the table is sized by it
        rows = [_run(settings, data_dir, scratch, model, processes, sharded, settings.items)
                for processes, sharded in runs]  # fmt: skip
        single = rows[0]["tokens_per_second"]
        for row in rows[1:]:
            row["scaling_efficiency"] = significant(row["tokens_per_second"] / (row["processes"] * single))
        results[model] = rows
    return results


def _world_sizes(settings: Settings) -> list[int]:
    """1, the `between` counts and `processes`, ascending, each once."""
    if any(not 1 < n < settings.processes for n in settings.between):
        raise SystemExit(f"between {list(settings.between)}: each count must lie strictly between 1 and processes "
                         f"({settings.processes}). Fix: --set between=[2] with processes=4, say")  # fmt: skip
    return sorted({1, *settings.between, settings.processes})


def _largest(settings: Settings, scratch: Path) -> dict[str, Any]:
    """The largest catalogue whose SASRec trains on 1 GPU (table replicated) and on N (split by rows): the peak memory
    per GPU at `items` and 2 x `items` gives the cost of an item and of the rest; the catalogue that fills
    `memory_fraction` of a GPU is predicted from them, and a model at 90 % of it trains a few steps to check."""
    if resolve_device(settings.device).type != "cuda":
        raise SystemExit("section 'largest' measures GPU memory. Fix: run it on CUDA, or leave it out of `sections`")
    data_dir = _synthetic_data(settings)
    capacity = torch.cuda.get_device_properties(0).total_memory / 2**30 * settings.memory_fraction
    results = {}
    for processes, sharded in [(1, False), (settings.processes, True)]:
        sizes = [settings.items, 2 * settings.items]
        peaks = [max(_run(settings, data_dir, scratch, "sasrec", processes, sharded, items, (2, 3))
                     ["peak_memory_gib_per_process"]) for items in sizes]  # fmt: skip
        per_item = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
        predicted = int(sizes[0] + (capacity - peaks[0]) / per_item)
        checked = predicted * 9 // 10
        check = _run(settings, data_dir, scratch, "sasrec", processes, sharded, checked, (2, 3))
        results[f"{processes} x {'row_sharded' if sharded else 'replicated'}"] = {
            "peak_gib_at": dict(zip(map(str, sizes), peaks, strict=True)),
            "bytes_per_item": significant(per_item * 2**30), "predicted_largest_items": predicted,
            "trained_items": checked, "trained_peak_gib_per_process": check["peak_memory_gib_per_process"],
        }  # fmt: skip
    return results


def _train_steps(
    settings_dict: dict[str, Any], data_dir: str, model_name: str, sharded: bool, items: int | None, warmup: int,
    timed: int, report: str,
) -> None:  # fmt: skip
    """One process of a run: `warmup` steps, then `timed` steps timed, of a model of `items` items (None: the data's);
    the first process writes the report."""
    settings = Settings(**settings_dict)
    device = resolve_device(settings.device)
    workers = join(device)
    device = workers.device(device)
    parts = PreparedParts.open(Path(data_dir), buffer_parts=settings.buffer_parts)
    torch.manual_seed(settings.seed)
    params = {"max_history": settings.max_history, "dim": settings.dim, "num_layers": settings.num_layers,
              "num_heads": settings.num_heads, "dropout": 0.0}  # fmt: skip
    if model_name == "sasrec":
        params["ffn_dim"] = 4 * settings.dim
    num_items = items or parts.num_items  # more items than the data's: a larger table, the same batches
    model = build_model(model_name, params, num_items)
    training = NextItemTraining(loss="sampled_softmax", num_negatives=settings.num_negatives)
    recipe = recipe_for(model, parts, settings.rows_per_process * workers.world_size, training)
    assert isinstance(recipe, NextItemRecipe)
    if sharded:
        check_shardable(model, recipe)
        shard_item_table(model, workers, device)
    model.to(device)
    optimization = build_optimization(model, lr=settings.lr, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                      total_steps=0, fused=device.type == "cuda")  # fmt: skip
    loss_of = DataParallelLoss(model, recipe, workers, find_unused_parameters=False)
    generator = torch.Generator().manual_seed(settings.seed)
    counter = BatchCounter()  # the batches are read and packed as training asks for them: their cost is timed too
    batches = counter.batches(parts, recipe, generator)
    bf16 = use_bf16_autocast("auto", device)

    def run(steps: int) -> float:
        chunk = itertools.islice(batches, steps)
        _synchronize(device)
        start = time.perf_counter()
        train_one_epoch(model, loss_of, chunk, optimization, bf16, False, generator)
        _synchronize(device)
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run(warmup)
    tokens, data_seconds, done = counter.tokens, counter.data_seconds, counter.steps
    seconds = run(timed)
    if counter.steps - done < timed:
        raise SystemExit(f"the data gives {counter.steps} batches, fewer than the steps asked. Fix: more users")
    tokens, data_seconds = counter.tokens - tokens, counter.data_seconds - data_seconds
    batches.close()  # the parts' reader, half-way through the epoch: closed here, not at interpreter exit
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else peak_resident_gib()
    peaks = [float(p) for p in gather_rows(torch.tensor([peak], dtype=torch.float64), workers)]
    if workers.is_main:
        table = "row_sharded" if sharded else "replicated"
        Path(report).write_text(json.dumps({
            "model": model_name, "processes": workers.world_size, "item_table": table,
            "items": num_items, "rows_per_step": settings.rows_per_process * workers.world_size,
            "timed_steps": timed,
            "tokens_per_second": significant(tokens / seconds),
            "seconds_per_step": significant(seconds / timed),
            "read_and_pack_share": significant(data_seconds / seconds),
            "peak_memory_gib_per_process": [significant(p) for p in peaks],
            "memory": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak resident set",
        }))  # fmt: skip
    leave()


def _allreduce(settings: Settings, scratch: Path) -> dict[str, Any]:
    report = scratch / "allreduce.json"
    run_on_processes(settings.processes, _time_allreduce, asdict(settings), str(report))
    result: dict[str, Any] = json.loads(report.read_text())
    logger.info("all-reduce: %s", result)
    return result


def _time_allreduce(settings_dict: dict[str, Any], report: str) -> None:
    """One process of the all-reduce timing; the first writes the report."""
    settings = Settings(**settings_dict)
    workers = join(resolve_device(settings.device))
    device = workers.device(resolve_device(settings.device))
    gradient = torch.ones(settings.items, settings.dim, device=device)
    for _ in range(settings.warmup_steps):
        torch.distributed.all_reduce(gradient)
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(settings.timed_steps):
        torch.distributed.all_reduce(gradient)
    _synchronize(device)
    seconds = (time.perf_counter() - start) / settings.timed_steps
    size = gradient.numel() * gradient.element_size()
    if workers.is_main:
        n = workers.world_size
        Path(report).write_text(json.dumps({
            "processes": n, "bytes": size, "milliseconds": significant(seconds * 1e3),
            "bus_gb_per_second": significant(size * 2 * (n - 1) / n / seconds / 1e9),
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
            out_dir = str(scratch / "beauty-n")
            run_on_processes(processes, _train_beauty, asdict(settings), str(data_dir), out_dir, str(report))
        runs[str(processes)] = json.loads(report.read_text())
    one, many = runs["1"]["test ndcg@10"], runs[str(settings.processes)]["test ndcg@10"]
    return {"config": settings.beauty_config, "overrides": settings.beauty_overrides, "runs": runs,
            "test ndcg@10 relative difference": significant(many / one - 1)}  # fmt: skip


def _train_beauty(settings_dict: dict[str, Any], data_dir: str, out_dir: str, report: str) -> None:
    """The pipeline's train step of the Beauty config (tracking off); the first process writes the report."""
    settings = Settings(**settings_dict)
    overrides = {**settings.beauty_overrides, "train.hardware.device": settings.device, "tracking.enabled": False}
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
