"""Pipeline step `enrich`: the prepared catalogue's items with text -> item_metadata.parquet, written by an LLM.

Reads `items.parquet` of a prepared directory, asks the configured backend (`recsys.enrich`) for every item with text
that the shared cache lacks (items named in `first` before the others: cold items first), and writes
`item_metadata.parquet` and `item_metadata.json` (the run's summary: counts, validity, speed, model and prompt) into
the same directory. Idempotent: a second run asks nothing and rewrites the same files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from recsys.data.schema import ITEM_ID, ITEMS_FILE
from recsys.enrich.cache import EnrichCache
from recsys.enrich.config import EnrichConfig, make_backend
from recsys.enrich.record import load_prompt
from recsys.enrich.run import METADATA_FILE, EnrichSummary, enrich_catalogue
from recsys.runtime.atomic import atomic_file
from recsys.semantic_ids.content import item_texts

logger = logging.getLogger(__name__)

SUMMARY_FILE = "item_metadata.json"


def enrich_step(
    config: EnrichConfig, data_dir: Path, cache_dir: Path, first: Sequence[str] = (), retry_failed: bool = False
) -> EnrichSummary:
    """Enrich the catalogue of `data_dir` (module docstring); returns the run's summary."""
    items = pl.read_parquet(data_dir / ITEMS_FILE)
    order = {item: rank for rank, item in enumerate(first)}
    items = items.with_columns(pl.col(ITEM_ID).replace_strict(order, default=len(order)).alias("_first")).sort(
        "_first", maintain_order=True
    )
    fields = [f for f in config.text_fields if f in items.columns]
    lengths = [pl.col(f).list.len() if isinstance(items.schema[f], pl.List) else
               pl.col(f).cast(pl.String).str.strip_chars().str.len_chars() for f in fields]  # fmt: skip
    has_text = items.select(pl.any_horizontal([n.fill_null(0) > 0 for n in lengths])).to_series() if fields else None
    texts = (
        [""] * items.height
        if has_text is None
        else [text if keep else "" for text, keep in zip(item_texts(items, fields), has_text.to_list(), strict=True)]
    )
    prompt = load_prompt(config.prompt, config.categories)
    backend = make_backend(config, cache_dir)
    cache = EnrichCache(cache_dir)
    try:
        summary = enrich_catalogue(
            items[ITEM_ID].to_list(), texts, backend, prompt, cache, data_dir / METADATA_FILE,
            batch_size=config.batch_size, limit=config.limit, retry_failed=retry_failed,
        )  # fmt: skip
    finally:
        cache.close()
    with atomic_file(data_dir / SUMMARY_FILE) as tmp:
        tmp.write_text(json.dumps(summary.record(), indent=2) + "\n")
    logger.info("enrich: %d of %d items with a record (%d failed, %d left), valid %.1f%%; %s", summary.ok,
                summary.items, summary.failed, summary.left, 100 * summary.valid_fraction,
                data_dir / METADATA_FILE)  # fmt: skip
    return summary
