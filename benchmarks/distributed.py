"""Data-parallel training on 1 and N processes of one host: tokens/s, scaling efficiency and peak memory per process
with the item table replicated vs split by rows; and Beauty's SASRec trained on 1 and N processes (test NDCG@10).

Usage:
    .venv/bin/python -m benchmarks.distributed                      # on a host with 2 GPUs (NCCL)
    .venv/bin/python -m benchmarks.distributed --config benchmarks/configs/distributed-smoke.yaml   # CPU, gloo

Settings: benchmarks/configs/distributed.yaml (`--config`, `--set KEY=VALUE`).

Throughput (section "throughput"): the synthetic data set of `users` x `items` (`features.synthetic`, prepared into
`data_dir` unless it is there) feeds each model of `models` (SASRec, HSTU at `dim`, the sampled softmax with
`num_negatives` shared negatives, and the batch's other targets with `in_batch_negatives`) through the trainer's own
step (`recsys.training.trainer.train_one_epoch`, the data-parallel loss) on 1 process, on each count of `between` and
on `processes`, each process taking `b` packed rows of every batch for each per-process batch b of
`per_process_batches` (weak scaling: N processes train N times the rows per step). Each configuration's processes
start once and run every batch in turn: `warmup_steps` steps and `warmup_epochs` whole epochs (an epoch's every
batch shape seen before the clock starts), then `repeats` timed windows of `timed_steps` steps, or
of `timed_epochs` whole epochs (each from its start: the window reads and packs what an epoch does, once; a window of
steps may hold an epoch's reading or not, whence the epochs). tokens/s is over all the timed windows (each window's
is reported too).
The batches come as the trainer takes them (`recsys.training.data_parallel.epoch_batches`: on several processes each
reads and packs its own share of every shuffle buffer), read from the prepared parts and packed as the steps ask for
them, so the timed steps include that work (`read_share` and `pack_share`: their shares of the time). Steps run over
as many epochs as they need, each reshuffled as training reshuffles its epochs; `mean_rows_per_step` is what the
batches held (a shuffle buffer of `buffer_parts` parts packs into whole batches and one shorter one: give large
batches large buffers).
tokens/s counts the targets of every process; scaling efficiency = tokens/s on N / (N * tokens/s on 1) at the same
per-process batch. With `launches` > 1 every configuration is launched that many times in turn, each launch's
efficiency taken against its own 1-process run, and the rows report the medians (`*_each_launch` beside them).
Each configuration runs in its own processes, started by torch's elastic launcher; peak memory is
each process's (`torch.cuda.max_memory_allocated`, or its resident set on a CPU). With `row_sharded`, N processes
also run with the item table split by rows (`train.shard_item_table`).

Profile (`profile: true`, throughput): after the timed steps of the per-process batch `profile_batch` (default: the
first), each process records `profile_steps` more steps with torch.profiler and the report gets a compact summary per
process: the GPU's busy and idle share of the steps, where the host was while the GPU idled, NCCL's kernel time,
host waits (synchronisations, device-to-host copies, `.item()`), the operators taking the most host and GPU time; on
CUDA also a memory snapshot of one step (`torch.cuda.memory._record_memory_history`): the memory held before it, its
peak, and the largest blocks alive at the peak with the code that allocated them. With `profile_dir`, each process's
trace (Chrome format, gzipped) and the snapshots (pickles for https://pytorch.org/memory_viz) are written there.

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

import bisect
import dataclasses
import gzip
import itertools
import json
import logging
import pickle
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    REPO,
    benchmark_parser,
    parse_run,
    provenance,
    result_name_for,
    settings_from,
    significant,
    synchronize,
    write_result,
)
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
from recsys.runtime.distributed import Workers, backend_for, gather_rows, join, leave
from recsys.training.data_parallel import DataParallelLoss, epoch_batches
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
    in_batch_negatives: bool = True  # the batch's other targets are negatives too (logits: targets x (S + targets))
    rows_per_process: int = 128  # packed rows per process and step: throughput's batch unless per_process_batches
    per_process_batches: tuple[int, ...] = ()  # throughput: each of these rows per process, in the same processes
    warmup_steps: int = 10
    timed_steps: int = 50
    repeats: int = 1  # throughput: this many timed windows (tokens/s of each reported)
    # throughput: every configuration launched this many times, in turn (1, N replicated, N split, 1, ...), so that
    # a host's drift falls on each alike; efficiencies are each launch's (N against the same launch's 1) and their
    # median
    launches: int = 1
    timed_epochs: int = 0  # > 0: a timed window is this many whole epochs, not timed_steps steps
    # whole epochs run after the warm-up steps, untimed: every batch shape of an epoch (its shorter last batch
    # included) has compiled and planned before the clock starts, whatever the batch
    warmup_epochs: int = 0
    row_sharded: bool = True
    # profile: torch.profiler traces and a CUDA memory snapshot of each configuration, at one per-process batch
    profile: bool = False
    profile_steps: int = 5
    profile_batch: int | None = None  # None: the first per-process batch
    profile_dir: str | None = None  # also write the traces and snapshots here
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
    name = result_name_for(settings.result_name, device.type)
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
    path = write_result(name, out, args.results_dir, reproduce)
    print(_table(out), f"-> {path}", sep="\n")
    return path


def _table(out: dict[str, Any]) -> str:
    """A short table of the sections that ran (the JSON has the rest)."""
    lines = []
    for model, rows in out.get("throughput", {}).items():
        for row in rows if model != "efficiency" else []:
            lines.append(f"{model:6} {row['processes']} x {row['item_table']:11} {row['rows_per_process']:5} rows "
                         f"{row['tokens_per_second']:>10,.0f} tokens/s {row['seconds_per_step'] * 1e3:7.1f} ms/step "
                         f"read {row['read_share']:.2f} pack {row['pack_share']:.2f} "
                         f"peak {max(row['peak_memory_gib_per_process']):.2f} GiB "
                         f"efficiency {row.get('scaling_efficiency', '-')}")  # fmt: skip
    for section in ("largest", "allreduce", "beauty"):
        if section in out:
            lines.append(f"{section}: {json.dumps(out[section])}")
    return "\n".join(lines)


def _synthetic_data(settings: Settings) -> Path:
    data_dir = Path(settings.data_dir.format(users=settings.users, items=settings.items))
    if not (data_dir / "meta.json").is_file():
        source = open_synthetic(num_users=settings.users, num_items=settings.items, seed=settings.seed)
        prepare(source, data_dir, PrepareSettings(partitions=settings.partitions))
    return data_dir


def _run(settings: Settings, data_dir: Path, scratch: Path, model: str, processes: int, sharded: bool,
         items: int | None = None, steps: tuple[int, int, int] | None = None,
         batches: tuple[int, ...] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One configuration on its own processes: its report, a row per per-process batch (`batches`, default the
    settings'; `steps`: warm-up, timed and repeats, default the settings')."""
    report = scratch / f"{model}-{processes}-{sharded}-{items}.json"
    steps = steps or (settings.warmup_steps, settings.timed_steps, settings.repeats)
    arguments = (asdict(settings), str(data_dir), model, sharded, items, steps, batches or _batches(settings),
                 str(report))  # fmt: skip
    run_on_processes(processes, _train_steps, *arguments)
    rows: list[dict[str, Any]] = json.loads(report.read_text())
    for row in rows:
        logger.info("%s", {k: v for k, v in row.items() if k != "profile"})
    return rows


def _batches(settings: Settings) -> tuple[int, ...]:
    return settings.per_process_batches or (settings.rows_per_process,)


def _throughput(settings: Settings, scratch: Path) -> dict[str, Any]:
    data_dir = _synthetic_data(settings)
    sizes = _world_sizes(settings)
    runs = [(n, False) for n in sizes] + ([(n, True) for n in sizes[1:]] if settings.row_sharded else [])
    results: dict[str, Any] = {}
    efficiency: dict[str, Any] = {}
    for model in settings.models:
        launches = []
        for _ in range(settings.launches):
            # a catalogue of `items` even where the interactions reach fewer of them: the table is sized by it
            configurations = [_run(settings, data_dir, scratch, model, processes, sharded, settings.items)
                              for processes, sharded in runs]  # fmt: skip
            launch = [row for batch in range(len(_batches(settings))) for row in (c[batch] for c in configurations)]
            _add_efficiency(launch)
            launches.append(launch)
        rows = launches[0] if len(launches) == 1 else _over_launches(launches)
        efficiency[model] = {}
        for row in rows:
            if row["processes"] > 1:
                key = f"{row['processes']} x {row['item_table']}"
                efficiency[model].setdefault(key, {})[str(row["rows_per_process"])] = row["scaling_efficiency"]
        results[model] = rows
    results["efficiency"] = efficiency  # model -> "N x table" -> rows per process -> scaling efficiency
    return results


def _add_efficiency(rows: list[dict[str, Any]]) -> None:
    """Each N-process row's scaling efficiency against the 1-process row of the same batch (rows of one launch)."""
    for row in rows:
        single = next(r for r in rows if r["processes"] == 1 and r["rows_per_process"] == row["rows_per_process"])
        if row["processes"] > 1:
            row["scaling_efficiency"] = significant(
                row["tokens_per_second"] / (row["processes"] * single["tokens_per_second"])
            )
            # the same over the steps' time less their reading and packing (what the GPUs and the step's host work
            # scale as): above, N processes also share the reading and packing one process does alone
            row["scaling_efficiency_without_reading_and_packing"] = significant(
                _without_data(row) / (row["processes"] * _without_data(single))
            )


# the numbers whose every launch a result lists beside their median
_EACH_LAUNCH = ("tokens_per_second", "scaling_efficiency", "scaling_efficiency_without_reading_and_packing")


def _over_launches(launches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per configuration and batch from every launch's: each measured number (tokens/s, seconds per step,
    the reading's share, ...) the median over the launches; tokens/s and the efficiencies with each launch's beside
    them."""
    rows = []
    for same in zip(*launches, strict=True):
        row = dict(same[0])
        for key, value in same[0].items():
            if isinstance(value, float):
                each = [r[key] for r in same]
                row[key] = significant(statistics.median(each))
                if key in _EACH_LAUNCH:
                    row[f"{key}_each_launch"] = each
        rows.append(row)
    return rows


def _without_data(row: dict[str, Any]) -> float:
    """tokens/s over the time not spent reading and packing."""
    return float(row["tokens_per_second"]) / max(1e-9, 1 - row["read_share"] - row["pack_share"])


def _world_sizes(settings: Settings) -> list[int]:
    """1, the `between` counts and `processes`, ascending, each once."""
    if any(not 1 < n < settings.processes for n in settings.between):
        raise SystemExit(f"between {list(settings.between)}: each count must lie strictly between 1 and processes "
                         f"({settings.processes}). Fix: --set between=[2] with processes=4, say")  # fmt: skip
    return sorted({1, *settings.between, settings.processes})


def _largest(settings: Settings, scratch: Path) -> dict[str, Any]:
    """The largest catalogue whose SASRec trains on 1 GPU (table replicated) and on N (split by rows): the peak memory
    per GPU at `items` and 2 x `items` gives the cost of an item and of the rest; the catalogue that fills
    `memory_fraction` of a GPU is predicted from it, and a model at 90 % of it trains a few steps to check."""
    if resolve_device(settings.device).type != "cuda":
        raise SystemExit("section 'largest' measures GPU memory. Fix: run it on CUDA, or leave it out of `sections`")
    data_dir = _synthetic_data(settings)
    capacity = torch.cuda.get_device_properties(0).total_memory / 2**30 * settings.memory_fraction
    quick = dataclasses.replace(settings, profile=False)  # a few steps at rows_per_process
    results = {}
    for processes, sharded in [(1, False), (settings.processes, True)]:
        sizes = [settings.items, 2 * settings.items]

        peaks = [max(_few_steps(quick, data_dir, scratch, processes, sharded, items)["peak_memory_gib_per_process"])
                 for items in sizes]  # fmt: skip
        per_item = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
        predicted = int(sizes[0] + (capacity - peaks[0]) / per_item)
        checked = predicted * 9 // 10
        check = _few_steps(quick, data_dir, scratch, processes, sharded, checked)
        results[f"{processes} x {'row_sharded' if sharded else 'replicated'}"] = {
            "peak_gib_at": dict(zip(map(str, sizes), peaks, strict=True)),
            "bytes_per_item": significant(per_item * 2**30), "predicted_largest_items": predicted,
            "trained_items": checked, "trained_peak_gib_per_process": check["peak_memory_gib_per_process"],
        }  # fmt: skip
    return results


def _few_steps(settings: Settings, data_dir: Path, scratch: Path, processes: int, sharded: bool,
               items: int) -> dict[str, Any]:  # fmt: skip
    """SASRec of `items` items, a few steps at `rows_per_process` (for its peak memory): its report."""
    return _run(settings, data_dir, scratch, "sasrec", processes, sharded, items, (2, 3, 1),
                (settings.rows_per_process,))[0]  # fmt: skip


@dataclass
class _Counts:
    """What a stream of batches gave so far: steps, targets (tokens), rows, epochs begun, seconds reading and
    packing."""

    steps: int = 0
    tokens: int = 0
    rows: int = 0
    epochs: int = 0
    read_seconds: float = 0.0
    pack_seconds: float = 0.0

    def since(self, before: _Counts) -> _Counts:
        return _Counts(*(getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)))


def _epoch(parts: PreparedParts, recipe: NextItemRecipe, generator: torch.Generator, workers: Workers,
           counts: _Counts) -> Generator[Any]:  # fmt: skip
    """One epoch of this process's batches as training takes them (`epoch_batches`: packed apart on several
    processes, or whole), counted into `counts`: its steps, reading and packing, and the targets and rows it trains
    on (a whole batch's by the first process alone, so that the processes' counts add up to the run's)."""
    counts.epochs += 1
    seconds: dict[str, float] = {"read": 0.0, "pack": 0.0}
    batches = epoch_batches(parts, recipe, generator, workers, seconds)
    counted = {"read": 0.0, "pack": 0.0}
    try:
        for batch in batches:
            counts.read_seconds += seconds["read"] - counted["read"]
            counts.pack_seconds += seconds["pack"] - counted["pack"]
            counted = dict(seconds)
            inner = getattr(batch, "batch", batch)  # a Share of this process, or a whole batch
            mine = getattr(batch, "has_rows", True) and (inner is not batch or workers.rank == 0)
            counts.steps += 1
            counts.tokens += int((inner.targets != 0).sum()) if mine else 0
            counts.rows += len(inner.targets) if mine else 0
            yield batch
    finally:
        if isinstance(batches, Generator):
            batches.close()  # the parts' reader, when the steps end half-way through an epoch


def _epochs(parts: PreparedParts, recipe: NextItemRecipe, generator: torch.Generator, workers: Workers,
            counts: _Counts) -> Generator[Any]:  # fmt: skip
    """`_epoch` after `_epoch`, each reshuffled as training reshuffles its epochs: as many steps as asked, however
    few batches an epoch holds."""
    while True:
        steps = counts.steps
        yield from _epoch(parts, recipe, generator, workers, counts)
        if counts.steps == steps:
            raise SystemExit(f"the prepared data at {parts.data_dir} gives no training batch in an epoch. Fix: more "
                             "users (`users`), or a data set whose users have at least 2 interactions")  # fmt: skip


def _train_steps(
    settings_dict: dict[str, Any], data_dir: str, model_name: str, sharded: bool, items: int | None,
    steps: tuple[int, int, int], batches: tuple[int, ...], report: str,
) -> None:  # fmt: skip
    """One process of a run: for each per-process batch of `batches`, `steps` = (warm-up steps, timed steps, repeats)
    of a model of `items` items (None: the data's), each timed window `timed_epochs` whole epochs where the settings
    say so; the first process writes the report (a row per batch)."""
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
    training = NextItemTraining(loss="sampled_softmax", num_negatives=settings.num_negatives,
                                in_batch_negatives=settings.in_batch_negatives)  # fmt: skip
    recipe = recipe_for(model, parts, batches[0] * workers.world_size, training)
    assert isinstance(recipe, NextItemRecipe)
    if sharded:
        check_shardable(model, recipe)
        shard_item_table(model, workers, device)
    model.to(device)
    optimization = build_optimization(model, lr=settings.lr, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                      total_steps=0, fused=device.type == "cuda")  # fmt: skip
    loss_of = DataParallelLoss(model, recipe, workers, find_unused_parameters=False)
    generator = torch.Generator().manual_seed(settings.seed)  # the data's: the same on every process, as in training
    negatives = torch.Generator().manual_seed(settings.seed + 1 + workers.rank)  # the loss's: one per process
    bf16 = use_bf16_autocast("auto", device)
    table = "row_sharded" if sharded else "replicated"

    def train(batches: Iterator[Any]) -> float:
        synchronize(device)
        start = time.perf_counter()
        train_one_epoch(model, loss_of, batches, optimization, bf16, negatives)
        synchronize(device)
        return time.perf_counter() - start

    rows: list[dict[str, Any]] = []
    for per_process in batches:
        counts = _Counts()
        batch_recipe = dataclasses.replace(recipe, rows_per_batch=per_process * workers.world_size)
        stream = _epochs(parts, batch_recipe, generator, workers, counts)

        def run(steps: int, stream: Iterator[Any] = stream) -> float:
            return train(itertools.islice(stream, steps))

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        warmup, timed, repeats = steps
        run(warmup)
        for _ in range(settings.warmup_epochs):
            train(_epoch(parts, batch_recipe, generator, workers, counts))
        windows = []
        for _ in range(repeats):
            before = dataclasses.replace(counts)
            if settings.timed_epochs:  # whole epochs from their start: each reads and packs what an epoch does
                whole = itertools.chain.from_iterable(
                    _epoch(parts, batch_recipe, generator, workers, counts) for _ in range(settings.timed_epochs)
                )
                seconds = train(whole)
            else:
                seconds = run(timed)
            windows.append((seconds, counts.since(before)))
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else peak_resident_gib()
        peaks = [float(p) for p in gather_rows(torch.tensor([peak], dtype=torch.float64), workers)]
        # the targets and rows every process trained on, window by window
        trained = gather_rows(torch.tensor([[c.tokens, c.rows] for _, c in windows]), workers)
        everyone = torch.stack(trained).sum(0).tolist()
        windows = [(seconds, dataclasses.replace(c, tokens=int(t), rows=int(r)))
                   for (seconds, c), (t, r) in zip(windows, everyone, strict=True)]  # fmt: skip
        label = f"{model_name}-{workers.world_size}-{table}-{per_process}"
        profile = _profile(settings, run, device, label, workers.rank) if _profiles(settings, per_process) else None
        stream.close()
        rows.append(_row(model_name, workers.world_size, table, num_items, per_process, windows, peaks, device))
        if profile is not None:
            profiles = _gathered_objects(profile, workers)
            rows[-1]["profile"] = {f"rank {rank}": summary for rank, summary in enumerate(profiles)}
    if workers.is_main:
        Path(report).write_text(json.dumps(rows))
    leave()


def _profiles(settings: Settings, per_process: int) -> bool:
    return settings.profile and per_process == (settings.profile_batch or _batches(settings)[0])


def _row(model: str, processes: int, table: str, items: int, per_process: int, windows: list[tuple[float, _Counts]],
         peaks: list[float], device: torch.device) -> dict[str, Any]:  # fmt: skip
    """The report of one batch, over its timed windows."""
    seconds = sum(s for s, _ in windows)
    total = _Counts()
    for _, counts in windows:
        total = _Counts(*(getattr(total, f.name) + getattr(counts, f.name) for f in dataclasses.fields(total)))
    return {
        "model": model, "processes": processes, "item_table": table, "items": items,
        "rows_per_process": per_process, "rows_per_step": per_process * processes,
        "mean_rows_per_step": significant(total.rows / total.steps), "timed_steps": total.steps // len(windows),
        "repeats": len(windows), "epochs_begun_while_timed": total.epochs, "tokens_timed": total.tokens,
        # over every timed step (not the median window: a window without an epoch's reading would hide its cost)
        "tokens_per_second": significant(total.tokens / seconds),
        "tokens_per_second_median_window": significant(statistics.median(c.tokens / s for s, c in windows)),
        "tokens_per_second_each_window": [significant(c.tokens / s) for s, c in windows],
        "seconds_per_step": significant(seconds / total.steps),
        "read_share": significant(total.read_seconds / seconds),
        "pack_share": significant(total.pack_seconds / seconds),
        "peak_memory_gib_per_process": [significant(p) for p in peaks],
        "memory": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak resident set",
    }  # fmt: skip


def _gathered_objects(value: Any, workers: Workers) -> list[Any]:
    """Every process's `value` (picklable), in rank order."""
    if not workers.distributed:
        return [value]
    gathered: list[Any] = [None] * workers.world_size
    torch.distributed.all_gather_object(gathered, value)
    return gathered


# host-side calls that wait for the GPU (or copy from it), counted in a profile
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
              "cudaMemcpy", "aten::item", "aten::_local_scalar_dense", "aten::nonzero")  # fmt: skip


def _profile(settings: Settings, run: Callable[[int], float], device: torch.device, label: str,
             rank: int) -> dict[str, Any]:  # fmt: skip
    """`settings.profile_steps` steps under torch.profiler, and on CUDA one step's memory snapshot: the summary."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = settings.profile_steps
    with profile(activities=activities) as prof:
        seconds = run(steps)
    with tempfile.TemporaryDirectory() as scratch:
        trace_path = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(trace_path))
        trace = json.loads(trace_path.read_text())
        if settings.profile_dir:
            out = Path(settings.profile_dir)
            out.mkdir(parents=True, exist_ok=True)
            with gzip.open(out / f"{label}-rank{rank}.trace.json.gz", "wb") as gz:
                gz.write(trace_path.read_bytes())
    summary: dict[str, Any] = {"steps": steps, "ms_per_step_profiled": significant(seconds * 1e3 / steps)}
    summary.update(_trace_summary(trace["traceEvents"], steps))
    summary["operators"] = _operator_table(prof.key_averages(), steps)
    if device.type == "cuda":
        keep = settings.profile_dir is not None and rank == 0  # the first process's pickle (they hold the same)
        where = Path(settings.profile_dir or ".") / f"{label}-rank{rank}.memory.pickle" if keep else None
        summary["memory"] = _memory_snapshot(run, device, where)
    return summary


def _trace_summary(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """From a Chrome trace: the GPU's busy and idle time per step, NCCL's kernels, where the host was (the innermost
    operator on the thread that ran most) while the GPU idled, and the host calls that wait on the GPU."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = sorted((e for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])  # fmt: skip
    host_ops = [e for e in complete if e.get("cat") == "cpu_op"]
    runtime = [e for e in complete if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    per_step = 1e-3 / steps  # microseconds in the trace -> milliseconds per step
    out: dict[str, Any] = {}
    if host_ops:
        start = min(e["ts"] for e in host_ops)
        wall = max(e["ts"] + e["dur"] for e in host_ops) - start
        out["host_ms_per_step"] = significant(wall * per_step)
    if kernels:
        busy, idle, cursor = 0.0, [], kernels[0]["ts"]
        for e in kernels:  # the union of the GPU's intervals, and the gaps between them
            if e["ts"] > cursor:
                idle.append((cursor, e["ts"]))
            busy += max(0.0, e["ts"] + e["dur"] - max(cursor, e["ts"]))
            cursor = max(cursor, e["ts"] + e["dur"])
        span = cursor - kernels[0]["ts"]
        nccl = sum(e["dur"] for e in kernels if "nccl" in e.get("name", "").lower())
        out["gpu"] = {
            "busy_ms_per_step": significant(busy * per_step), "span_ms_per_step": significant(span * per_step),
            "idle_share": significant(1 - busy / span) if span else 0.0, "kernels_per_step": len(kernels) // steps,
            "nccl_ms_per_step": significant(nccl * per_step),
        }  # fmt: skip
        out["gpu_idle_while_host_in"] = _idle_by_host_operator(idle, host_ops, per_step)
    waits: dict[str, list[float]] = {}
    for e in runtime + host_ops:
        if e.get("name") in HOST_WAITS:
            waits.setdefault(e["name"], []).append(e["dur"])
    copies = Counter(e.get("name", "") for e in kernels if e.get("cat") == "gpu_memcpy")
    out["host_waits_per_step"] = {name: {"calls": significant(len(d) / steps), "ms": significant(sum(d) * per_step)}
                                  for name, d in sorted(waits.items())}  # fmt: skip
    out["copies_per_step"] = {name: significant(n / steps) for name, n in copies.most_common()}
    return out


def _idle_by_host_operator(idle: list[tuple[float, float]], host_ops: list[dict[str, Any]],
                           per_step: float, top: int = 12) -> dict[str, float]:  # fmt: skip
    """The GPU's idle gaps (over 20 us) summed by the innermost host operator running at each gap's middle, on any
    thread (the training loop's, or autograd's during the backward pass)."""
    ops = sorted(host_ops, key=lambda e: e["ts"])
    starts = [e["ts"] for e in ops]
    totals: dict[str, float] = {}
    for begin, end in idle:
        if end - begin < 20:
            continue
        middle = (begin + end) / 2
        found = "(between operators)"
        before = bisect.bisect_right(starts, middle)
        for e in reversed(ops[max(0, before - 2000) : before]):  # the latest-starting one containing it
            if e["ts"] + e["dur"] >= middle:
                found = e["name"]
                break
        totals[found] = totals.get(found, 0.0) + end - begin
    largest = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return {name: significant(us * per_step) for name, us in largest}


def _operator_table(averages: Any, steps: int, top: int = 15) -> list[dict[str, Any]]:
    """The operators taking the most host time (self) and the most GPU time (self), per step."""

    def device_us(a: Any) -> float:
        return float(getattr(a, "self_device_time_total", getattr(a, "self_cuda_time_total", 0.0)))

    rows = {}
    for key in (lambda a: a.self_cpu_time_total, device_us):
        for a in sorted(averages, key=key, reverse=True)[:top]:
            rows[a.key] = {"name": a.key, "calls_per_step": significant(a.count / steps),
                           "host_self_ms_per_step": significant(a.self_cpu_time_total / 1e3 / steps),
                           "gpu_self_ms_per_step": significant(device_us(a) / 1e3 / steps)}  # fmt: skip
    return sorted(rows.values(), key=lambda r: -(r["host_self_ms_per_step"] + r["gpu_self_ms_per_step"]))


def _memory_snapshot(run: Callable[[int], float], device: torch.device, path: Path | None,
                     top: int = 12) -> dict[str, Any]:  # fmt: skip
    """One step with the CUDA caching allocator's history on: the memory held before it, its peak, and the largest
    blocks alive at the peak, each with the innermost frame of the project's code that allocated it (or of torch)."""
    torch.cuda.synchronize(device)
    held = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    try:
        run(1)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    if path is not None:
        path.write_bytes(pickle.dumps(snapshot))
    trace = snapshot["device_traces"][device.index or 0]
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    current = best = 0
    at_best: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
            current += event["size"]
            if current > best:
                best, at_best = current, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])[0]
    largest = sorted(at_best.values(), key=lambda block: -block[0])[:top]
    before = sorted((b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
                     and not b.get("frames")), reverse=True)[:top]  # fmt: skip
    return {
        "held_before_step_gib": significant(held / 2**30),
        "peak_in_step_gib": significant((held + best) / 2**30),
        "allocated_in_step_at_peak_gib": significant(best / 2**30),
        "largest_at_peak": [{"mib": significant(size / 2**20), "where": _where(frames)} for size, frames in largest],
        "largest_held_before_mib": [significant(size / 2**20) for size in before],
    }


def _where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame in the project's code (recsys/, benchmarks/), else the innermost in torch's Python."""
    for wanted in ("/recsys/", "/torch/"):
        for frame in frames:
            if wanted in frame.get("filename", ""):
                name = frame["filename"].split(wanted, 1)[1]
                return f"{wanted.strip('/')}/{name}:{frame.get('line')} {frame.get('name')}"
    return "?"


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
    synchronize(device)
    start = time.perf_counter()
    for _ in range(settings.timed_steps):
        torch.distributed.all_reduce(gradient)
    synchronize(device)
    seconds = (time.perf_counter() - start) / settings.timed_steps
    size = gradient.numel() * gradient.element_size()
    if workers.is_main:
        n = workers.world_size
        Path(report).write_text(json.dumps({
            "processes": n, "bytes": size, "milliseconds": significant(seconds * 1e3),
            "bus_gb_per_second": significant(size * 2 * (n - 1) / n / seconds / 1e9),
        }))  # fmt: skip
    leave()


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
