"""Semantic-ID benchmark: content-embedding throughput and SID health of several tokenizer configs; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.semantic_ids [--config benchmarks/configs/semantic-ids.yaml] [--set KEY=VALUE ...]

The config lists the experiment configs to compare (each with a `sid` section, all on one data set) and the raw
data they read. Throughput embeds every catalog text once with no cache, with the encoder of the first config whose
semantic IDs come from content (the first batch, which loads kernels, is timed separately). Health (collision rate
before de-duplication, per-level utilisation and perplexity, reconstruction error) comes from building each config's
semantic IDs from scratch through the pipeline (its content embeddings are reused). Results are keyed by each
config's name. Writes benchmarks/results/<dataset>-semantic-ids.json.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.quality import dataset_record, semantic_id_health
from pipelines.config import ExperimentConfig, load_config
from pipelines.runner import run_pipeline
from pipelines.semantic_ids import sid_settings
from recsys.data.schema import ITEM_IDX, ITEMS_FILE
from recsys.semantic_ids.content import ContentConfig, item_texts, load_encoder

# what the benchmark sets for itself: not part of what a result reproduces
UNRECORDED = {"tracking.enabled": False}


@dataclass(frozen=True)
class Settings:
    configs: tuple[str, ...]  # experiment configs with a `sid` section (paths in the repo), on one data set
    data_path: str | None = None  # raw input of their data source (None: the configs' own data section)
    experiment: dict[str, Any] = field(default_factory=dict)  # dotted overrides of every config


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    experiment_configs(settings)  # every config must load, build semantic IDs and share the data
    return settings


def experiment_configs(settings: Settings, unrecorded: dict[str, Any] | None = None) -> list[ExperimentConfig]:
    """The experiment configs of `settings`, with its data path and overrides (+ `unrecorded`) applied."""
    data = {} if settings.data_path is None else {"data.path": settings.data_path}
    overrides = {**data, **settings.experiment, **(unrecorded or {})}
    configs = [load_config(REPO / path, overrides) for path in settings.configs]
    if not configs:
        raise SystemExit("configs: empty. Fix: list the experiment configs to compare")
    for path, config in zip(settings.configs, configs, strict=True):
        if config.sid is None:
            raise SystemExit(f"{path}: has no sid section. Fix: list configs that build semantic IDs")
        if config.data != configs[0].data:
            raise SystemExit(f"{path}: its data differs from {settings.configs[0]}'s. Fix: configs of one data set")
    return configs


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """The tokenizers, data path and semantic-ID settings the result records that differ from the config's."""
    configs = experiment_configs(settings)
    tokenizers = result.get("tokenizers", {})
    if list(tokenizers) != [c.name for c in configs]:
        yield f"tokenizers: the result has {list(tokenizers)}, the config {[c.name for c in configs]}"
    recorded_path = result.get("dataset", {}).get("path")
    if settings.data_path is not None and recorded_path != settings.data_path:
        yield f"dataset.path: the result has {recorded_path!r}, the config {settings.data_path!r}"
    for config in configs:
        assert config.sid is not None
        recorded = tokenizers.get(config.name, {}).get("build", {}).get("settings", {})
        where = f"tokenizers.{config.name}.build.settings"
        yield from _differences(where, recorded, sid_settings(config.sid, config.content))


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/semantic-ids.yaml")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench"), help="prepared data, SIDs, cache")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    work = args.work_dir.resolve()
    configs = experiment_configs(settings, UNRECORDED)
    prepared, _ = run_pipeline(configs[0], work, until="prepare_data")
    assert prepared.data is not None
    data_dir = prepared.data.data_dir
    items = pl.read_parquet(data_dir / ITEMS_FILE).sort(ITEM_IDX)
    content = next((c.content for c in configs if c.sid is not None and c.sid.vectors == "content"), None)
    result: dict[str, Any] = {
        "dataset": {**dataset_record(settings.data_path, configs[0]), "items": items.height},
        "embedding_throughput": None if content is None else embedding_throughput(items, content),
        "tokenizers": {config.name: sid_health(config, data_dir, work) for config in configs},
        **provenance("sentence-transformers", "faiss-cpu"),
    }
    path = write_result(_result_name(settings.data_path, configs[0]), result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


def embedding_throughput(items: pl.DataFrame, content: ContentConfig) -> dict[str, Any]:
    """Items/s of the encoder over the whole catalog, batched as the pipeline batches (no cache)."""
    texts = sorted(item_texts(items, content.text_fields), key=len, reverse=True)  # as the pipeline batches
    encoder = load_encoder(content)
    device = "cuda" if torch.cuda.is_available() and content.device != "cpu" else "cpu"
    t0 = time.perf_counter()
    encoder.encode(texts[: content.batch_size])  # warm-up: first-call kernel selection and allocation
    warmup = time.perf_counter() - t0
    t0 = time.perf_counter()
    for lo in range(0, len(texts), content.batch_size):
        encoder.encode(texts[lo : lo + content.batch_size])
    seconds = time.perf_counter() - t0
    return {
        "model": content.model,
        "text_fields": list(content.text_fields),
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "batch_size": content.batch_size,
        "items": len(texts),
        "seconds": round(seconds, 2),
        "items_per_second": round(len(texts) / seconds, 1),
        "warmup_batch_seconds": round(warmup, 2),
    }


def sid_health(config: ExperimentConfig, data_dir: Path, work: Path) -> dict[str, Any]:
    """Build `config`'s semantic IDs from scratch on the prepared `data_dir` (the content embeddings and their cache
    are reused) and report their health."""
    outputs, _ = run_pipeline(config, work, until="build_semantic_ids", data_dir=data_dir, rerun=["build_semantic_ids"])
    assert outputs.semantic_ids is not None
    return semantic_id_health(outputs.semantic_ids.path)


def _result_name(data_path: str | None, config: ExperimentConfig) -> str:
    dataset = config.data.source if data_path is None else Path(data_path).resolve().name.removeprefix("amazon-")
    return f"{dataset}-semantic-ids"


def _differences(where: str, recorded: Any, expected: Any) -> Iterator[str]:
    """Where the recorded (nested) settings differ from `expected` (keys `expected` gained since are not checked)."""
    if isinstance(recorded, dict) and recorded and isinstance(expected, dict):
        for key, value in recorded.items():
            yield from _differences(f"{where}.{key}", value, expected.get(key, "<absent>"))
    elif recorded != expected:
        yield f"{where}: the result has {recorded!r}, the config {expected!r}"


if __name__ == "__main__":
    main()
