"""`train.compile` speedup: median training-step time of SASRec and HSTU (positions, and positions + time buckets),
eager vs `torch.compile`; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.compile_speedup   # on CUDA when there is one, else the CPU
    .venv/bin/python -m benchmarks.compile_speedup --set device=cuda --set steps=50 --set warmup=10

Settings: configs/benchmarks/compile-speedup.yaml (`--config`, `--set KEY=VALUE`). A step is what the trainer runs per
batch (NextItemRecipe full-softmax loss, backward, Adam step) on packed rows of Beauty's shape (16 rows x 50 items,
12,101 items; session-like timestamps: minutes apart, a day between the two runs of a row), bf16 autocast where the
trainer would use it (`precision`). Both variants are timed in the same process, after warm-up steps (for the compiled
one, after compiling). Writes benchmarks/results/compile-speedup-<device type>.json, with the settings and how to
reproduce it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.reproduce import jsonable, mismatches
from recsys.data.batching import PackedBatch
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.training.recipes import NextItemRecipe

ModelName = Literal["sasrec", "hstu", "hstu_time_buckets"]


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (configs/benchmarks/compile-speedup.yaml)."""

    device: str  # "auto": cuda when there is one, else cpu (resolved at run time; the result records the one used)
    steps: int  # timed steps per variant (median)
    warmup: int  # untimed steps before them (for the compiled variant: the compilation)
    models: tuple[ModelName, ...]  # hstu_time_buckets: HSTU with `time_buckets` buckets of time gaps too
    items: int  # catalog size V (Beauty: 12,101)
    rows: int  # packed rows per batch
    max_history: int  # the models' window = the row width (each row: two users' runs, 3/5 and 2/5 of it)
    time_buckets: int  # num_time_buckets of hstu_time_buckets
    precision: Literal["auto", "bf16", "fp32"]  # as train.precision: "auto" = bf16 autocast where the trainer uses it


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def packed_batch(s: Settings, generator: torch.Generator, timestamps: bool) -> PackedBatch:
    """Rows of two users' runs each (lengths 3/5 and 2/5 of the row: 30 + 20), as the packer fills them; with the
    inputs' and targets' times when `timestamps` (as the trainer packs them for models that read them)."""
    first = s.max_history * 3 // 5
    second = s.max_history - first
    inputs = torch.randint(1, s.items + 1, (s.rows, s.max_history), generator=generator)
    targets = torch.randint(1, s.items + 1, (s.rows, s.max_history), generator=generator)
    segments = torch.cat([torch.ones(s.rows, first), torch.full((s.rows, second), 2)], dim=1).long()
    positions = torch.cat([torch.arange(s.max_history - first, s.max_history),
                           torch.arange(s.max_history - second, s.max_history)]).expand(s.rows, -1)  # fmt: skip
    gaps = torch.randint(30, 600, (s.rows, s.max_history + 1), generator=generator)
    gaps[:, first] = 86_400  # the second user of the row
    times = 1_700_000_000 + gaps.cumsum(dim=1)  # of the inputs, then one more: the last target's
    if not timestamps:
        return PackedBatch(inputs, targets, segments, positions)
    return PackedBatch(inputs, targets, segments, positions, times[:, :-1], times[:, 1:])


def step_seconds(model: SASRec | HSTU, compiled: bool, device: torch.device, s: Settings) -> float:
    """Median seconds per training step."""
    model = model.to(device).train()
    if compiled:
        model.compile()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    recipe = NextItemRecipe(s.max_history, s.rows)
    generator = torch.Generator().manual_seed(0)
    batch = packed_batch(s, generator, timestamps=bool(getattr(model, "reads_timestamps", False))).to(device)
    bf16 = use_bf16_autocast(s.precision, device)
    times = []
    for i in range(s.warmup + s.steps):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = recipe.loss(model, batch, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= s.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def builders(s: Settings) -> dict[ModelName, Callable[[], SASRec | HSTU]]:
    return {
        "sasrec": lambda: SASRec(SASRecConfig(num_items=s.items, max_history=s.max_history)),
        "hstu": lambda: HSTU(HSTUConfig(num_items=s.items, max_history=s.max_history)),
        "hstu_time_buckets": lambda: HSTU(
            HSTUConfig(num_items=s.items, max_history=s.max_history, num_time_buckets=s.time_buckets)
        ),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "configs/benchmarks/compile-speedup.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    device = resolve_device(s.device)
    build = builders(s)
    rows = {}
    for model in s.models:
        torch.manual_seed(0)
        eager = step_seconds(build[model](), False, device, s)
        torch.manual_seed(0)
        compiled = step_seconds(build[model](), True, device, s)
        rows[model] = {
            "eager_ms": significant(eager * 1e3),
            "compiled_ms": significant(compiled * 1e3),
            "speedup": significant(eager / compiled, 3),
        }
        print(f"{model}: eager {eager * 1e3:.1f} ms, compiled {compiled * 1e3:.1f} ms, {eager / compiled:.2f}x")
    name = f"compile-speedup-{device.type}"
    result = {
        "config": {
            "items": s.items,
            "rows": s.rows,
            "max_history": s.max_history,
            "steps": s.steps,
            "warmup": s.warmup,
            "bf16_autocast": use_bf16_autocast(s.precision, device),
            "loss": "full softmax",
        },
        "models": rows,
        "device": str(device),
        "settings": asdict(s),
        **provenance(),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


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
        "models": list(result.get("models", {})),
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
