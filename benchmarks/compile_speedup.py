"""`train.compile` speedup: median training-step time of SASRec and HSTU (positions, and positions + time buckets),
eager vs `torch.compile`; writes JSON.

Usage:
    .venv/bin/python benchmarks/compile_speedup.py [--device cpu|cuda] [--steps 30]

A step is what the trainer runs per batch (NextItemRecipe full-softmax loss, backward, Adam step) on packed
rows of Beauty's shape (16 rows x 50 items, 12,101 items; session-like timestamps: minutes apart, a day between
the two runs of a row), bf16 autocast where the trainer would use it. Both
variants are timed in the same process, after warm-up steps (for the compiled one, after compiling).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, significant, versions, write_result
from recsys.data.batching import PackedBatch
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.device import use_bf16_autocast
from recsys.training.recipes import NextItemRecipe

NUM_ITEMS, ROWS, MAX_LEN = 12_101, 16, 50


def packed_batch(generator: torch.Generator) -> PackedBatch:
    """Rows of two users' runs each (lengths 30 + 20), as the packer fills them."""
    inputs = torch.randint(1, NUM_ITEMS + 1, (ROWS, MAX_LEN), generator=generator)
    targets = torch.randint(1, NUM_ITEMS + 1, (ROWS, MAX_LEN), generator=generator)
    segments = torch.cat([torch.ones(ROWS, 30), torch.full((ROWS, 20), 2)], dim=1).long()
    positions = torch.cat([torch.arange(20, 50), torch.arange(30, 50)]).expand(ROWS, -1)
    gaps = torch.randint(30, 600, (ROWS, MAX_LEN + 1), generator=generator)
    gaps[:, 30] = 86_400  # the second user of the row
    times = 1_700_000_000 + gaps.cumsum(dim=1)  # of the inputs, then one more: the last target's
    return PackedBatch(inputs, targets, segments, positions, times[:, :-1], times[:, 1:])


def step_seconds(model: torch.nn.Module, compiled: bool, device: torch.device, steps: int, warmup: int) -> float:
    """Median seconds per training step."""
    model = model.to(device).train()
    if compiled:
        model.compile()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    recipe = NextItemRecipe(MAX_LEN, ROWS)
    generator = torch.Generator().manual_seed(0)
    batch = packed_batch(generator).to(device)
    bf16 = use_bf16_autocast("auto", device)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = recipe.loss(model, batch, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    device = torch.device(args.device)
    builders = {
        "sasrec": lambda: SASRec(SASRecConfig(num_items=NUM_ITEMS, max_len=MAX_LEN)),
        "hstu": lambda: HSTU(HSTUConfig(num_items=NUM_ITEMS, max_len=MAX_LEN)),
        "hstu_time_buckets": lambda: HSTU(HSTUConfig(num_items=NUM_ITEMS, max_len=MAX_LEN, num_time_buckets=32)),
    }
    rows = {}
    for name, build in builders.items():
        torch.manual_seed(0)
        eager = step_seconds(build(), False, device, args.steps, args.warmup)
        torch.manual_seed(0)
        compiled = step_seconds(build(), True, device, args.steps, args.warmup)
        rows[name] = {
            "eager_ms": significant(eager * 1e3),
            "compiled_ms": significant(compiled * 1e3),
            "speedup": significant(eager / compiled, 3),
        }
        print(f"{name}: eager {eager * 1e3:.1f} ms, compiled {compiled * 1e3:.1f} ms, {eager / compiled:.2f}x")
    result = {
        "name": f"compile-speedup-{device.type}",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {
            "items": NUM_ITEMS,
            "rows": ROWS,
            "max_len": MAX_LEN,
            "steps": args.steps,
            "warmup": args.warmup,
            "bf16_autocast": use_bf16_autocast("auto", device),
            "loss": "full softmax",
        },
        "models": rows,
        "device": str(device),
        "machine": machine(),
        "versions": versions(),
        "command": command(),
    }
    print(f"-> {write_result(result['name'], result, args.results_dir)}")


if __name__ == "__main__":
    main()
