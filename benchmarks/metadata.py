"""LLM-written item metadata on Beauty: validity and speed of the local model, per device (docs/enrich.md).

Usage:
    .venv/bin/python -m benchmarks.metadata                              # the CPU runs
    .venv/bin/python -m benchmarks.metadata --set only=[gpu-batched]     # on a GPU

Each run enriches its items from a fresh cache (so everything is generated, nothing read back) and records `items`,
`valid_fraction`, `failed`, `truncated`, `items_per_second` and `seconds_per_item`, with its machine. Runs not in
`only` keep their previous record. The GPU run's records are kept (`records_file`) for later runs to reuse.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import torch

from benchmarks.common import benchmark_parser, machine, parse_run, settings_from, versions, write_result
from recsys.enrich.cache import EnrichCache
from recsys.enrich.config import EnrichConfig, make_backend
from recsys.enrich.record import load_prompt
from recsys.enrich.run import enrich_catalogue


@dataclass(frozen=True)
class Settings:
    items_csv: str
    model: str = "gemma3-270m"
    prompt: str = "item-metadata-v1"
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> device, threads, batch_size, items
    only: list[str] = field(default_factory=list)
    seed: int = 0
    examples: int = 10


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    unknown = set(settings.only) - settings.runs.keys()
    if unknown:
        raise SystemExit(f"only names runs the config lacks: {sorted(unknown)}; its runs: {sorted(settings.runs)}")
    return settings


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "configs/benchmarks/beauty-metadata.yaml")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench-metadata"))
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    catalogue = pl.read_csv(settings.items_csv, schema_overrides={"item_id": pl.String}).sample(
        fraction=1.0, shuffle=True, seed=settings.seed
    )
    previous = args.results_dir / "beauty-metadata.json"
    runs = json.loads(previous.read_text())["runs"] if previous.is_file() else {}
    for label in settings.only:
        runs[label] = _run(settings, label, catalogue, args.work_dir)
    result = {"catalogue_items": catalogue.height, "model": settings.model, "prompt": settings.prompt, "runs": runs}
    path = write_result("beauty-metadata", result, args.results_dir, reproduce)
    print(json.dumps({k: {m: v.get(m) for m in ("valid_fraction", "items_per_second")} for k, v in runs.items()}))
    print(f"-> {path}")
    return path


def _run(settings: Settings, label: str, catalogue: pl.DataFrame, work: Path) -> dict[str, Any]:
    run = settings.runs[label]
    if run["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"run {label} needs a CUDA GPU and this machine has none. Fix: run it on the lent GPU")
    items = catalogue.head(run["items"]) if run.get("items") else catalogue
    cache_dir = work / label
    shutil.rmtree(cache_dir, ignore_errors=True)  # a fresh cache: every item is generated
    config = EnrichConfig(model=settings.model, prompt=settings.prompt, device=run["device"],
                          threads=run.get("threads"), batch_size=run["batch_size"])  # fmt: skip
    backend = make_backend(config, work / "models")
    out = work / f"{label}.parquet"
    summary = enrich_catalogue(items["item_id"].to_list(), items["title"].fill_null("").to_list(), backend,
                               load_prompt(settings.prompt), EnrichCache(cache_dir), out,
                               batch_size=run["batch_size"])  # fmt: skip
    examples = pl.read_parquet(out).head(settings.examples).to_dicts()
    gpu = torch.cuda.get_device_name() if run["device"] == "cuda" else None
    return {
        **run,
        **summary.record(),
        "gpu": gpu,
        "examples": examples,
        "machine": machine(),
        "versions": versions("transformers", "torch"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


if __name__ == "__main__":
    main()
