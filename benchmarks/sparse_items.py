"""Row-sparse item gradients: SASRec training-step time with dense Adam vs SparseAdam as the catalogue grows; JSON.

Usage:
    .venv/bin/python -m benchmarks.sparse_items
    .venv/bin/python -m benchmarks.sparse_items --set device=cuda

Settings: benchmarks/configs/sparse-items.yaml (`--config`, `--set KEY=VALUE`). A step is what the trainer runs per
batch with `model.training.loss: sampled_softmax` (the recipe's loss on random packed rows, backward, the optimizers'
step, `recsys.training.optimization`), for a SASRec over each catalogue size, dense and sparse in the same process.
Dense Adam reads and writes every row of the item table and its two moments every step; SparseAdam only the rows the
step read (inputs, targets, negatives). CPU threads as the trainer sets them (torch's default; `threads` to fix).
Writes benchmarks/results/sparse-items-<device type>.json.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from recsys.data.batching import PackedBatch
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.device import apply_cpu_threads, resolve_device
from recsys.training.optimization import build_optimization
from recsys.training.recipes.next_item import NextItemRecipe


@dataclass(frozen=True)
class Settings:
    catalogue_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    dim: int = 64
    max_history: int = 50
    rows_per_batch: int = 16
    num_negatives: int = 1024
    steps: int = 20
    warmup: int = 3
    device: str = "cpu"
    threads: int | None = None  # CPU: torch threads; None = torch's default, as the trainer


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/sparse-items.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = resolve_device(settings.device)
    if device.type == "cpu":
        apply_cpu_threads(settings.threads)
    rows = []
    for items in settings.catalogue_sizes:
        dense, sparse = (_step_seconds(settings, items, device, sparse) for sparse in (False, True))
        rows.append({"items": items, "dense_adam_ms": significant(dense * 1e3),
                     "sparse_adam_ms": significant(sparse * 1e3), "speedup": significant(dense / sparse)})  # fmt: skip
        print(rows[-1], flush=True)
    threads = {"threads": torch.get_num_threads()} if device.type == "cpu" else {}
    result = {"settings": asdict(settings), "device": device.type, **threads, "steps": rows, **provenance()}
    return write_result(f"sparse-items-{device.type}", result, args.results_dir, reproduce)


def _step_seconds(settings: Settings, items: int, device: torch.device, sparse: bool) -> float:
    """Median seconds of one training step (forward, sampled-softmax loss, backward, optimizer step)."""
    torch.manual_seed(0)
    config = SASRecConfig(num_items=items, max_history=settings.max_history, dim=settings.dim, num_heads=2,
                          ffn_dim=4 * settings.dim)  # fmt: skip
    model = SASRec(config).to(device)
    if sparse:
        model.use_sparse_item_gradients()
    optimization = build_optimization(model, lr=1e-3, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                      total_steps=1, fused=device.type == "cuda")  # fmt: skip
    probs = torch.full((items + 1,), 1.0 / items)
    probs[0] = 0.0
    recipe = NextItemRecipe(settings.max_history, settings.rows_per_batch, sampling_probs=probs,
                            num_negatives=settings.num_negatives)  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    shape = (settings.rows_per_batch, settings.max_history)
    times = []
    for step in range(settings.warmup + settings.steps):
        batch = PackedBatch(
            inputs=torch.randint(1, items + 1, shape, generator=generator),
            targets=torch.randint(1, items + 1, shape, generator=generator),
            segments=torch.ones(shape, dtype=torch.long),
            positions=torch.arange(settings.max_history).expand(shape),
        ).to(device)
        start = time.perf_counter()
        loss, _ = recipe.loss(model, batch, generator)
        optimization.zero_grad()
        loss.backward()
        optimization.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= settings.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


if __name__ == "__main__":
    main()
