"""Pipeline step `enrich`: the prepared catalogue's items with text -> item_metadata.parquet, written by an LLM.

Reads `items.parquet` of a prepared directory, asks the configured backend (`recsys.enrich`) for every item with text
that the shared cache lacks (items named in `first` before the others: cold items first; a `records` file's answers
are taken first), and writes `item_metadata.parquet` and `item_metadata.json` (the run's summary: counts, validity,
speed, model and prompt) into its output directory (`recsys enrich`: the prepared directory itself). Idempotent: a
second run asks nothing and rewrites the same files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from recsys.data.schema import ITEM_ID, ITEMS_FILE, METADATA_FILE, PREPARE_HINT
from recsys.enrich.cache import EnrichCache
from recsys.enrich.config import EnrichConfig, make_backend
from recsys.enrich.record import load_prompt
from recsys.enrich.records import read_answers
from recsys.enrich.run import EnrichSummary, enrich_catalogue
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_file
from recsys.semantic_ids.content import item_texts

logger = logging.getLogger(__name__)

SUMMARY_FILE = "item_metadata.json"


def enrich_step(
    config: EnrichConfig, data_dir: Path, out_dir: Path, cache_dir: Path, first: Sequence[str] = (),
    retry_failed: bool = False,
) -> EnrichSummary:  # fmt: skip
    """Enrich the catalogue of `data_dir` into `out_dir` (module docstring); returns the run's summary."""
    items = read_catalogue(data_dir, config.text_fields)
    order = {item: rank for rank, item in enumerate(first)}
    items = items.with_columns(pl.col(ITEM_ID).replace_strict(order, default=len(order)).alias("_first")).sort(
        "_first", maintain_order=True
    )
    texts = enrich_texts(items, config.text_fields)
    prompt = load_prompt(config.prompt, config.categories)
    records = read_answers(Path(config.records), prompt.categories) if config.records is not None else None
    cache = EnrichCache(cache_dir)
    try:
        if records is not None:
            logger.info("enrich: %d answers taken from %s", cache.seed(records), config.records)
        backend = make_backend(config, cache_dir)
        summary = enrich_catalogue(
            items[ITEM_ID].to_list(), texts, backend, prompt, cache, out_dir / METADATA_FILE,
            batch_size=config.batch_size, limit=config.limit, retry_failed=retry_failed,
        )  # fmt: skip
    finally:
        cache.close()
    with atomic_file(out_dir / SUMMARY_FILE) as tmp:
        tmp.write_text(json.dumps(summary.record(), indent=2) + "\n")
    logger.info("enrich: %d of %d items with a record (%d failed, %d left), valid %.1f%%; %s", summary.ok,
                summary.items, summary.failed, summary.left, 100 * summary.valid_fraction,
                out_dir / METADATA_FILE)  # fmt: skip
    return summary


def read_catalogue(data_dir: Path, text_fields: Sequence[str]) -> pl.DataFrame:
    """items.parquet of the prepared directory `data_dir`, checked: a text `item_id` without nulls, and `text_fields`
    (those it has) of text, numbers or lists of them; DataError naming what is wrong and how to fix it."""
    path = data_dir / ITEMS_FILE
    if not path.is_file():
        what = f"a directory without {ITEMS_FILE}" if data_dir.is_dir() else "not a directory"
        what = what if data_dir.exists() else "no such directory"
        raise DataError(data_dir, f"{what}, where a prepared directory (with {ITEMS_FILE}) is needed", PREPARE_HINT)
    try:
        items = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as err:
        raise DataError(path, f"not a readable parquet file ({type(err).__name__}: {str(err)[:200]})",
                        PREPARE_HINT) from err  # fmt: skip
    if items.schema.get(ITEM_ID) != pl.String:
        found = f"is {items.schema[ITEM_ID]}" if ITEM_ID in items.columns else "is missing"
        raise DataError(path, f"its {ITEM_ID!r} column {found}, not text (String)",
                        f"write the item ids as text (e.g. cast them), or {PREPARE_HINT}")  # fmt: skip
    if items[ITEM_ID].null_count():
        raise DataError(path, f"{items[ITEM_ID].null_count()} items have no {ITEM_ID}", "give every item its id")
    wrong = [f"{f} is {items.schema[f]}" for f in text_fields if f in items.columns and not _readable(items.schema[f])]
    if wrong:
        raise DataError(path, f"text fields that are not text: {', '.join(wrong)}",
                        "name only text columns (strings, numbers, lists of them) in enrich.text_fields")  # fmt: skip
    return items


def _readable(dtype: pl.DataType) -> bool:
    """Whether a column of `dtype` reads as text: strings, numbers, or a list of them."""
    inner = dtype.inner if isinstance(dtype, pl.List) else dtype
    return inner is not None and (inner.is_numeric() or inner in (pl.String, pl.Categorical, pl.Null))


def enrich_texts(items: pl.DataFrame, text_fields: Sequence[str]) -> list[str]:
    """Each item's text as the LLM reads it (`item_texts` of the fields it has), "" for an item with none (not the
    item id `item_texts` falls back on: an id tells the model nothing)."""
    fields = [f for f in text_fields if f in items.columns]
    if not fields:
        return [""] * items.height
    lengths = [pl.col(f).list.len() if isinstance(items.schema[f], pl.List) else
               pl.col(f).cast(pl.String).str.strip_chars().str.len_chars() for f in fields]  # fmt: skip
    has_text = items.select(pl.any_horizontal([n.fill_null(0) > 0 for n in lengths])).to_series().to_list()
    return [text if keep else "" for text, keep in zip(item_texts(items, fields), has_text, strict=True)]
