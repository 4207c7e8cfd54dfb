"""What the intervals cost: `bootstrap_intervals` (one model's metrics) and `paired_difference` (two models on the
same users: bootstrap + sign-flip randomisation test) at Beauty's test split size, on this machine's CPU threads.

Usage:
    .venv/bin/python -m benchmarks.bootstrap_cost

Settings: benchmarks/configs/bootstrap-cost.yaml (`--config`, `--set KEY=VALUE`). Per-user metrics come from ranks
drawn like a recommender's (geometric, most users far down the list), through `per_user_metrics` at `ks` (recall@k
and ndcg@k for each k, and mrr: 7 at the default ks); each call is timed `repeats` times after one
warm-up, medians reported. Writes benchmarks/results/bootstrap-cost.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    benchmark_parser,
    median_seconds,
    parse_run,
    provenance,
    settings_from,
    significant,
    write_result,
)
from recsys.evaluation.uncertainty import Uncertainty, bootstrap_intervals, paired_difference, per_user_metrics


@dataclass(frozen=True)
class Settings:
    users: int = 22_363  # Beauty's test users
    items: int = 12_101
    ks: tuple[int, ...] = (5, 10, 50)
    resamples: int = 1000
    repeats: int = 5
    threads: int | None = None  # torch CPU threads (None: torch's default, one per core)
    seed: int = 0


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/bootstrap-cost.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    if s.threads is not None:
        torch.set_num_threads(s.threads)
    generator = torch.Generator().manual_seed(s.seed)
    ranks = [_ranks(s, generator) for _ in range(2)]  # two models' ranks of the same users' targets
    names, values_a = per_user_metrics(ranks[0], s.ks)
    values_b = per_user_metrics(ranks[1], s.ks)[1]
    uncertainty = Uncertainty(resamples=s.resamples, seed=s.seed)
    timings = {
        "bootstrap_intervals": median_seconds(lambda: bootstrap_intervals(values_a, uncertainty), s.repeats),
        "paired_difference": median_seconds(
            lambda: paired_difference(values_a, values_b, names, uncertainty), s.repeats
        ),
    }
    result = {
        "settings": asdict(s), "metrics": names, "torch_threads": torch.get_num_threads(),
        "median_seconds": {name: significant(seconds) for name, seconds in timings.items()}, **provenance(),
    }  # fmt: skip
    path = write_result("bootstrap-cost", result, args.results_dir, reproduce)
    print(f"{s.resamples} resamples x {s.users:,} users x {len(names)} metrics: "
          + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in timings.items()) + f"\n-> {path}")  # fmt: skip
    return path


def _ranks(s: Settings, generator: torch.Generator) -> torch.Tensor:
    """(users,) 0-based target ranks, geometric with a mean of ~1/20 of the catalogue, capped at its size."""
    uniform = torch.rand(s.users, generator=generator, dtype=torch.float64)
    return (-(s.items / 20) * torch.log1p(-uniform)).long().clamp(max=s.items - 1)


if __name__ == "__main__":
    main()
