"""`train.compile` speedup: median training-step time of SASRec and HSTU (positions, and positions + time buckets),
eager vs `torch.compile` with static shapes vs with dynamic shapes (as the trainer compiles), in each compile mode;
and the graphs dynamic compilation makes across history lengths; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.compile_speedup   # on CUDA when there is one, else the CPU
    .venv/bin/python -m benchmarks.compile_speedup --set device=cuda --set steps=50 --set warmup=10
    .venv/bin/python -m benchmarks.compile_speedup --config benchmarks/configs/compile-speedup-smoke.yaml  # seconds

Settings: benchmarks/configs/compile-speedup.yaml (`--config`, `--set KEY=VALUE`). A step is what the trainer runs per
batch (NextItemRecipe full-softmax loss, backward, Adam step) on packed rows of Beauty's shape (16 rows x 50 items,
12,101 items; session-like timestamps: minutes apart, a day between the two runs of a row), bf16 autocast where the
trainer would use it (`precision`). Every variant trains the same initial weights on the same batch, in one process,
from an empty compile cache; its median is over `steps` steps after `warmup` (the compiled ones compile in the first
warm-up step, recorded apart as `first_step_s`). Variants: `eager`; `static` (`dynamic=False`, the first of `modes`);
`dynamic` (`recsys.training.compilation.compile_model`, the trainer's, in each of `modes`). Modes other than the
default tune GPU kernels or replay CUDA graphs: on a CPU, or with `backend: aot_eager`, they are skipped, and the
result says why.

The graph count is the trainer's compilation (dynamic, the first mode) of a fresh model, trained on packed rows at
each batch size of `count_rows`, then on left-padded histories (the path scoring takes) at `lengths` lengths from
`shortest` to `max_history` at each of those batch sizes: the graphs each path compiled (1 = no recompilation).
Writes benchmarks/results/compile-speedup-<device type>.json, with the settings and how to reproduce it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
import torch._dynamo
from torch import nn

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.reproduce import jsonable, mismatches
from recsys.data.batching import PackedBatch
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.training.compilation import compile_model, compiled_graphs
from recsys.training.config import CompileMode
from recsys.training.recipes import NextItemRecipe

ModelName = Literal["sasrec", "hstu", "hstu_time_buckets"]
Compile = Callable[[nn.Module], None] | None  # how a variant compiles the model; None = eager


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/compile-speedup.yaml)."""

    device: str  # "auto": cuda when there is one, else cpu (resolved at run time; the result records the one used)
    steps: int  # timed steps per variant (median)
    warmup: int  # untimed steps before them (for the compiled variants: the compilation)
    models: tuple[ModelName, ...]  # hstu_time_buckets: HSTU with `time_buckets` buckets of time gaps too
    items: int  # catalog size V (Beauty: 12,101)
    rows: int  # packed rows per batch
    max_history: int  # the models' window = the row width (each row: two users' runs, 3/5 and 2/5 of it)
    time_buckets: int  # num_time_buckets of hstu_time_buckets
    precision: Literal["auto", "bf16", "fp32"]  # as train.precision: "auto" = bf16 autocast where the trainer uses it
    # torch.compile's backend: "inductor" (the trainer's); "aot_eager" makes the same graphs and recompilations
    # without generating kernels (the smoke run: its times say nothing about speed)
    backend: Literal["inductor", "aot_eager"]
    modes: tuple[CompileMode, ...]  # timed with dynamic shapes; the first also with static shapes, and counted
    shortest: int  # graph count: the shortest history
    lengths: int  # graph count: this many history lengths, evenly spaced from `shortest` to `max_history`
    count_rows: tuple[int, ...]  # graph count: the batch sizes (>= 2: dynamo gives sizes 0 and 1 graphs of their own)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def packed_batch(s: Settings, generator: torch.Generator, timestamps: bool, rows: int | None = None) -> PackedBatch:
    """`rows` (default `s.rows`) rows of two users' runs each (lengths 3/5 and 2/5 of the row: 30 + 20), as the
    packer fills them; with the inputs' and targets' times when `timestamps` (as the trainer packs them for models that
    read them)."""
    rows = rows or s.rows
    first = s.max_history * 3 // 5
    second = s.max_history - first
    inputs = torch.randint(1, s.items + 1, (rows, s.max_history), generator=generator)
    targets = torch.randint(1, s.items + 1, (rows, s.max_history), generator=generator)
    segments = torch.cat([torch.ones(rows, first), torch.full((rows, second), 2)], dim=1).long()
    positions = torch.cat([torch.arange(s.max_history - first, s.max_history),
                           torch.arange(s.max_history - second, s.max_history)]).expand(rows, -1)  # fmt: skip
    gaps = torch.randint(30, 600, (rows, s.max_history + 1), generator=generator)
    gaps[:, first] = 86_400  # the second user of the row
    times = 1_700_000_000 + gaps.cumsum(dim=1)  # of the inputs, then one more: the last target's
    if not timestamps:
        return PackedBatch(inputs, targets, segments, positions)
    return PackedBatch(inputs, targets, segments, positions, times[:, :-1], times[:, 1:])


def reads_timestamps(model: nn.Module) -> bool:
    return bool(getattr(model, "reads_timestamps", False))


@dataclass(frozen=True)
class StepTimes:
    median_s: float  # per step, after the warm-up
    first_s: float  # the first step: the compilation, for a compiled variant


def step_times(
    build: Callable[[], SASRec | HSTU], timed: dict[str, Compile], device: torch.device, s: Settings
) -> dict[str, StepTimes]:
    """Train a model built by `build` per variant (compiled by it; the same initial weights and the same batch) for
    warm-up + timed steps, a step of each variant in turn, so that a slow spell of the machine hits all of them."""
    torch._dynamo.reset()  # no other model's graphs: these variants' 1 + len(modes) stay under the recompile limit (8)
    models, optimizers = {}, {}
    for name, compile_ in timed.items():
        torch.manual_seed(0)
        models[name] = build().to(device).train()
        if compile_ is not None:
            compile_(models[name])
        optimizers[name] = torch.optim.Adam(models[name].parameters(), lr=1e-3)
    batch = packed_batch(s, torch.Generator().manual_seed(0), reads_timestamps(models["eager"])).to(device)
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(s.warmup + s.steps):
        for name, model in models.items():
            times[name].append(train_step(model, optimizers[name], batch, device, s))
    return {name: StepTimes(statistics.median(t[s.warmup :]), t[0]) for name, t in times.items()}


def train_step(
    model: SASRec | HSTU, optimizer: torch.optim.Optimizer, batch: PackedBatch, device: torch.device, s: Settings
) -> float:
    """One training step as the trainer's (full-softmax loss, backward, Adam): its seconds."""
    start = time.perf_counter()
    torch.compiler.cudagraph_mark_step_begin()  # a new iteration for CUDA graphs (modes that replay them)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16_autocast(s.precision, device)):
        loss, _ = NextItemRecipe(s.max_history, s.rows).loss(model, batch, torch.Generator())  # full softmax: no draws
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def count_lengths(s: Settings) -> list[int]:
    """The graph count's history lengths: `s.lengths` distinct ones from `s.shortest` to `s.max_history`."""
    lengths = sorted({round(x) for x in torch.linspace(s.shortest, s.max_history, s.lengths).tolist()})
    if len(lengths) < s.lengths or s.shortest < 2:
        raise ValueError(
            f"lengths={s.lengths} distinct history lengths from shortest={s.shortest} to max_history={s.max_history} "
            "do not fit. Fix: a longer max_history, a shorter `shortest` (>= 2), or fewer `lengths`"
        )
    return lengths


def history_inputs(s: Settings, model: nn.Module, rows: int, length: int) -> dict[str, Any]:
    """The forward's arguments for `rows` left-padded histories of `length` items (with their times, for a model that
    reads them), as scoring gives them."""
    generator = torch.Generator().manual_seed(length)
    histories = torch.randint(0, s.items + 1, (rows, length), generator=generator)
    if not reads_timestamps(model):
        return {"item_ids": histories}
    times = 1_700_000_000 + torch.randint(30, 600, (rows, length + 1), generator=generator).cumsum(dim=1)
    return {"item_ids": histories, "timestamps": times[:, :-1], "query_times": times[:, 1:]}


def packed_inputs(s: Settings, model: nn.Module, rows: int) -> dict[str, Any]:
    """The forward's arguments for `rows` packed rows, as the recipe's loss gives them."""
    batch = packed_batch(s, torch.Generator().manual_seed(rows), reads_timestamps(model), rows)
    arguments = {"item_ids": batch.inputs, "segments": batch.segments, "positions": batch.positions}
    if batch.timestamps is None:
        return arguments
    return arguments | {"timestamps": batch.timestamps, "query_times": batch.next_timestamps}


def graphs_per_path(model: SASRec | HSTU, device: torch.device, s: Settings) -> dict[str, int]:
    """Compile `model` as the trainer does (from an empty cache), then train on packed rows, then on left-padded
    histories of every count length, each at every batch size of `s.count_rows`: the graphs each path compiled."""
    model = model.to(device).train()
    torch._dynamo.reset()
    compile_model(model, s.modes[0], s.backend)
    bf16 = use_bf16_autocast(s.precision, device)
    calls = {
        "packed_rows": [packed_inputs(s, model, rows) for rows in s.count_rows],
        "histories": [history_inputs(s, model, rows, length) for rows in s.count_rows for length in count_lengths(s)],
    }
    graphs = {}
    for path, arguments in calls.items():
        before = compiled_graphs()
        for call in arguments:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model(**{name: tensor.to(device) for name, tensor in call.items()})
            out.float().square().mean().backward()
        graphs[path] = compiled_graphs() - before
    return graphs


def variants(s: Settings, device: torch.device) -> tuple[dict[str, Compile], dict[str, str]]:
    """The ways each model is timed, by name, and the modes skipped with the reason."""
    first = s.modes[0]
    timed: dict[str, Compile] = {
        "eager": None,
        "static": lambda model: model.compile(dynamic=False, mode=first, backend=s.backend),
        "dynamic": partial(compile_model, mode=first, backend=s.backend),
    }
    skipped: dict[str, str] = {}
    for mode in s.modes[1:]:
        reason = _skip_reason(mode, device, s.backend)
        if reason is None:
            timed[f"dynamic {mode}"] = partial(compile_model, mode=mode, backend=s.backend)
        else:
            skipped[mode] = reason
    return timed, skipped


def _skip_reason(mode: CompileMode, device: torch.device, backend: str) -> str | None:
    if backend != "inductor":
        return f"backend {backend}: compile modes are inductor's"
    if device.type == "cpu" and mode != "default":
        return "CPU: this mode tunes Triton GPU kernels and/or replays CUDA graphs; it is timed on CUDA"
    return None


def builders(s: Settings) -> dict[ModelName, Callable[[], SASRec | HSTU]]:
    return {
        "sasrec": lambda: SASRec(SASRecConfig(num_items=s.items, max_history=s.max_history)),
        "hstu": lambda: HSTU(HSTUConfig(num_items=s.items, max_history=s.max_history)),
        "hstu_time_buckets": lambda: HSTU(
            HSTUConfig(num_items=s.items, max_history=s.max_history, num_time_buckets=s.time_buckets)
        ),
    }


def measure(
    build: Callable[[], SASRec | HSTU], timed: dict[str, Compile], device: torch.device, s: Settings
) -> dict[str, Any]:
    """One model's figures: step times per variant, speedups over eager, and the graph count."""
    times = step_times(build, timed, device, s)
    torch.manual_seed(0)
    graphs = graphs_per_path(build(), device, s)
    eager = times["eager"].median_s
    compiled = {name: t for name, t in times.items() if name != "eager"}
    return {
        "step_ms": {name: significant(t.median_s * 1e3) for name, t in times.items()},
        "speedup_over_eager": {name: significant(eager / t.median_s, 3) for name, t in compiled.items()},
        "first_step_s": {name: significant(t.first_s, 3) for name, t in compiled.items()},
        "graphs": graphs,
    }


def summary(model: str, figures: dict[str, Any]) -> str:
    """One line of the printed table."""
    steps = ", ".join(f"{name} {ms:.1f} ms" for name, ms in figures["step_ms"].items())
    graphs = ", ".join(f"{path} {n}" for path, n in figures["graphs"].items())
    return f"{model}: {steps}; graphs: {graphs}"


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/compile-speedup.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    device = resolve_device(s.device)
    build = builders(s)
    timed, skipped = variants(s, device)
    if not s.models:
        raise SystemExit("no models to measure. Fix: name some in `models` (sasrec, hstu, hstu_time_buckets)")
    rows: dict[str, Any] = {}
    for model in s.models:
        rows[model] = measure(build[model], timed, device, s)
        print(summary(model, rows[model]))
        # written after every model: a run cut off (a device lease's limit, a hang in a later model's compile) keeps
        # the rows it measured, and says which models it lacks
        missing = [m for m in s.models if m not in rows]
        path = write_result(f"compile-speedup-{device.type}", _result(s, device, rows, skipped, missing),
                            args.results_dir, reproduce)  # fmt: skip
    for mode, reason in skipped.items():
        print(f"skipped {mode}: {reason}")
    print(f"-> {path}")
    return path


def _result(
    s: Settings, device: torch.device, rows: dict[str, Any], skipped: dict[str, str], missing: list[str]
) -> dict[str, Any]:
    return {
        "config": {
            "items": s.items,
            "rows": s.rows,
            "max_history": s.max_history,
            "steps": s.steps,
            "warmup": s.warmup,
            "bf16_autocast": use_bf16_autocast(s.precision, device),
            "loss": "full softmax",
            "backend": s.backend,
            "modes": list(s.modes),
            "count_lengths": count_lengths(s),
            "count_rows": list(s.count_rows),
        },
        "models": rows,
        "not_measured_yet": missing,
        "skipped": skipped,
        "device": str(device),
        "settings": asdict(s),
        **provenance(),
    }


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (`config`, the device, the models timed, and `settings` where it has
    them) that differs from `settings`. Results from before the configs name the window `max_len`."""
    config = result.get("config", {})
    recorded = {
        "config.items": config.get("items"),
        "config.rows": config.get("rows"),
        "config.max_history": config.get("max_history", config.get("max_len")),
        "config.steps": config.get("steps"),
        "config.warmup": config.get("warmup"),
        # a run cut off names the models it lacks: they count as the config's, not as a mismatch
        "models": list(result.get("models", {})) + list(result.get("not_measured_yet", [])),
    }
    expected: dict[str, Any] = {
        "config.items": settings.items,
        "config.rows": settings.rows,
        "config.max_history": settings.max_history,
        "config.steps": settings.steps,
        "config.warmup": settings.warmup,
        "models": list(settings.models),
    }
    if settings.device != "auto":  # "auto" is whatever the machine had
        recorded["device"], expected["device"] = result.get("device"), str(torch.device(settings.device))
    if settings.precision != "auto":  # "auto" depends on the machine too
        recorded["config.bf16_autocast"] = config.get("bf16_autocast")
        expected["config.bf16_autocast"] = settings.precision == "bf16"
    if "settings" in result:
        recorded |= {f"settings.{key}": value for key, value in result["settings"].items()}
        expected |= {f"settings.{key}": value for key, value in jsonable(asdict(settings)).items()}
    yield from mismatches(recorded, expected)


if __name__ == "__main__":
    main()
