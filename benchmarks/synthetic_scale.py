"""The synthetic generator at scale: catalogue build times (exact vs sampled follow-ups) and the wall time and peak RSS
of streaming 10^6 to 10^7 users to parquet; JSON.

Usage:
    .venv/bin/python -m benchmarks.synthetic_scale
    .venv/bin/python -m benchmarks.synthetic_scale --set 'streams=[{users: 1000000, items: 100000}]'

Settings: benchmarks/configs/synthetic-scale.yaml (`--config`, `--set KEY=VALUE`). Catalogue: per size, the seconds
of the catalog (items, titles), of the follow-up links as the block path draws them (`_sampled_followups`,
O(N K log N)) and, up to `exact_max_items`, as the single stream does (`_exact_followups`, the Gumbel top-K over
every item of the domain that every size used before the block path: quadratic). Streams: per (users, items),
`iter_synthetic` chunk by chunk into parquet files in a temp dir, in a fresh process (spawned, so that its peak RSS
is its own): wall and CPU seconds, rows/s, the RSS after the imports and the peak. Writes
benchmarks/results/synthetic-scale.json.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from features import synthetic
from features.synthetic import SyntheticConfig, iter_synthetic, synthetic_items
from recsys.runtime.budget import peak_resident_gib


@dataclass(frozen=True)
class Stream:
    users: int
    items: int


@dataclass(frozen=True)
class Settings:
    catalogue_sizes: tuple[int, ...] = (15_000, 60_000, 150_000, 1_000_000)
    exact_max_items: int = 60_000  # the quadratic builder above this takes minutes to hours
    streams: tuple[Stream, ...] = (Stream(1_000_000, 100_000), Stream(10_000_000, 1_000_000))
    users_per_chunk: int = 100_000
    seed: int = 0


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/synthetic-scale.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    catalogue = []
    for items in settings.catalogue_sizes:
        catalogue.append(_catalogue_seconds(SyntheticConfig(seed=settings.seed, num_items=items), settings))
        print(catalogue[-1], flush=True)
    streams = []
    spawn = multiprocessing.get_context("spawn")
    for stream in settings.streams:
        config = SyntheticConfig(seed=settings.seed, num_users=stream.users, num_items=stream.items)
        with spawn.Pool(1) as pool:  # a fresh process per stream: ru_maxrss is a process's peak
            streams.append(pool.apply(_stream_to_parquet, (config, settings.users_per_chunk)))
        print(streams[-1], flush=True)
    result = {"settings": asdict(settings), "catalogue": catalogue, "streams": streams, **provenance()}
    return write_result("synthetic-scale", result, args.results_dir, reproduce)


def _catalogue_seconds(config: SyntheticConfig, settings: Settings) -> dict[str, Any]:
    """Seconds of the catalog and of each follow-up builder (the exact one only up to `exact_max_items`)."""
    rng = np.random.default_rng(config.seed)
    started = time.perf_counter()
    catalog = synthetic._build_catalog(config, rng)
    row: dict[str, Any] = {"items": config.num_items, "catalog_s": significant(time.perf_counter() - started)}
    builders = {"sampled_followups_s": synthetic._sampled_followups}
    if config.num_items <= settings.exact_max_items:
        builders["exact_followups_s"] = synthetic._exact_followups
    for name, build in builders.items():
        started = time.perf_counter()
        build(config, catalog, np.random.default_rng(config.seed))
        row[name] = significant(time.perf_counter() - started)
    return row


def _stream_to_parquet(config: SyntheticConfig, users_per_chunk: int) -> dict[str, Any]:
    """In the spawned process: stream the dataset into parquet files (one per chunk) and measure it."""
    rss_before = _current_rss_bytes()
    started, cpu_started = time.perf_counter(), time.process_time()
    rows, largest_chunk_bytes = 0, 0.0
    with tempfile.TemporaryDirectory() as out:
        synthetic_items(config).write_parquet(Path(out) / "items.parquet")
        for i, chunk in enumerate(iter_synthetic(config, users_per_chunk=users_per_chunk)):
            chunk.write_parquet(Path(out) / f"interactions-{i:05d}.parquet")
            rows += chunk.height
            largest_chunk_bytes = max(largest_chunk_bytes, chunk.estimated_size())
        parquet_bytes = sum(path.stat().st_size for path in Path(out).iterdir())
    wall = time.perf_counter() - started
    return {
        "users": config.num_users,
        "items": config.num_items,
        "interactions": rows,
        "users_per_chunk": users_per_chunk,
        "wall_s": significant(wall),
        "cpu_s": significant(time.process_time() - cpu_started),
        "rows_per_s": significant(rows / wall),
        "rss_after_imports_gib": significant(rss_before / 2**30),
        "peak_rss_gib": significant(peak_resident_gib()),
        "largest_chunk_mib": significant(largest_chunk_bytes / 2**20),
        "parquet_gib": significant(parquet_bytes / 2**30),
    }


def _current_rss_bytes() -> int:
    """Resident set size now (Linux: /proc/self/statm, in pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    main()
