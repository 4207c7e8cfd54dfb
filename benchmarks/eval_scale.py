"""Full-ranking evaluation at catalogue scale: wall time and peak memory of `evaluate` over U users x V items; JSON.

Usage:
    .venv/bin/python -m benchmarks.eval_scale
    .venv/bin/python -m benchmarks.eval_scale --set device=cuda --set users=1000000

Settings: benchmarks/configs/eval-scale.yaml (`--config`, `--set KEY=VALUE`). A SASRec of the configured shape (random
weights: ranking costs the same trained or not) ranks each of U users' held-out item among all V items, from a random
history of `history` items, in blocks of `item_block` items (`EvalConfig.item_block`); the wall time, the users/s and
the peak memory (resident set on the CPU, allocated device memory on a GPU) are recorded. Writes
benchmarks/results/eval-scale-<device type>.json.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.budget import peak_resident_gib
from recsys.runtime.device import apply_cpu_threads, resolve_device


@dataclass(frozen=True)
class Settings:
    users: int = 100_000
    items: int = 1_000_000
    history: int = 50
    dim: int = 64
    batch_size: int = 1024
    item_block: int = 65_536
    device: str = "cpu"
    seed: int = 0


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/eval-scale.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = resolve_device(settings.device)
    if device.type == "cpu":
        apply_cpu_threads(None)
    generator = torch.Generator().manual_seed(settings.seed)
    histories = torch.randint(1, settings.items + 1, (settings.users, settings.history), generator=generator)
    split = EvalSplit(
        histories=Jagged.from_lengths(histories.flatten(), torch.full((settings.users,), settings.history)),
        targets=torch.randint(1, settings.items + 1, (settings.users,), generator=generator),
        user_idx=torch.arange(settings.users),
    )
    torch.manual_seed(settings.seed)
    model = SASRec(SASRecConfig(num_items=settings.items, max_history=settings.history, dim=settings.dim,
                                num_heads=2, ffn_dim=4 * settings.dim)).to(device).eval()  # fmt: skip
    config = EvalConfig(ks=(10,), batch_size=settings.batch_size, item_block=settings.item_block)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = evaluate(model, split, settings.items, config)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (
        {"peak_gpu_memory_gib": significant(torch.cuda.max_memory_allocated() / 2**30)}
        if device.type == "cuda"
        else {"peak_rss_gib": significant(peak_resident_gib())}
    )
    out = {
        "settings": asdict(settings),
        "device": device.type,
        "seconds": significant(seconds),
        "users_per_second": significant(settings.users / seconds),
        "user_item_pairs_per_second": significant(settings.users * settings.items / seconds),
        **peak,
        "ndcg@10 (random weights: a check, not a quality figure)": significant(result.metrics["ndcg@10"]),
        **provenance(),
    }
    path = write_result(f"eval-scale-{device.type}", out, args.results_dir, reproduce)
    print({k: v for k, v in out.items() if k not in ("machine", "versions", "command")}, f"-> {path}", sep="\n")
    return path


if __name__ == "__main__":
    main()
