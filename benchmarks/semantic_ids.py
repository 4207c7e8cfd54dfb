"""Semantic-ID benchmark: content-embedding throughput and SID health of several tokenizer configs; writes JSON.

Usage:
    .venv/bin/python benchmarks/semantic_ids.py --data-dir ../shared/data/amazon-beauty \
        --config configs/beauty-sid-rqvae.yaml --config configs/beauty-sid-rqkmeans.yaml \
        --config configs/beauty-tiger-random.yaml

Throughput embeds every catalog text once with no cache (the first batch, which loads kernels, is timed
separately). Health (collision rate before de-duplication, per-level utilisation and perplexity,
reconstruction error) comes from building each config's semantic IDs from scratch.
Writes benchmarks/results/<name>.json (default name: <dataset>-semantic-ids).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, versions, write_result
from pipelines.config import ExperimentConfig, load_config
from pipelines.content import embed_content_step
from pipelines.data import prepare_step
from pipelines.experiment import ExperimentPaths
from pipelines.semantic_ids import SEMANTIC_IDS_FILE, build_semantic_ids_step
from recsys.data.schema import ITEM_IDX, ITEMS_FILE
from recsys.semantic_ids.codes import read_semantic_ids
from recsys.semantic_ids.content import ContentConfig, item_texts, load_encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, action="append", required=True, help="config with a sid section")
    parser.add_argument("--data-dir", type=Path, required=True, help="raw input of the configs' data source")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench"), help="prepared data, SIDs, cache")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument("--name", default=None, help="result file name (default: <dataset>-semantic-ids)")
    args = parser.parse_args()
    # force: importing torchrec (through the model registry) already put a WARNING-level handler on the root
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)

    work = args.work_dir.resolve()
    configs = [load_config(path, {"data.path": str(args.data_dir)}) for path in args.config]
    for path, config in zip(args.config, configs, strict=True):
        if config.sid is None:
            raise SystemExit(f"{path}: has no sid section; pass configs that build semantic IDs")
    data_dir = prepare_step(configs[0].data, ExperimentPaths.under(work, configs[0]).data_dir)
    items = pl.read_parquet(data_dir / ITEMS_FILE).sort(ITEM_IDX)
    assert configs[0].sid is not None
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "dataset": {"name": args.data_dir.resolve().name, "path": str(args.data_dir), "items": items.height},
        "embedding_throughput": embedding_throughput(items, configs[0].sid.content),
        "tokenizers": {path.stem: sid_health(c, data_dir, work) for path, c in zip(args.config, configs, strict=True)},
        "machine": machine(),
        "versions": versions("sentence-transformers", "faiss-cpu"),
        "command": command(),
    }
    name = args.name or f"{args.data_dir.resolve().name.removeprefix('amazon-')}-semantic-ids"
    print(f"-> {write_result(name, result, args.results_dir)}")


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
    """Build `config`'s semantic IDs from scratch (the embedding cache is reused) and report their health."""
    assert config.sid is not None
    paths = ExperimentPaths.under(work, config)
    shutil.rmtree(paths.sid_dir, ignore_errors=True)  # a fresh build, so `seconds` is measured here
    embeddings = embed_content_step(config.sid.content, data_dir, paths.content_dir, paths.cache_dir)
    path = build_semantic_ids_step(config.sid, data_dir, embeddings, paths.sid_dir)
    assert path.name == SEMANTIC_IDS_FILE
    sids, stats = read_semantic_ids(path)
    return {"codebook_sizes": list(sids.codebook_sizes), **stats.to_dict(), "build": sids.meta}


if __name__ == "__main__":
    main()
