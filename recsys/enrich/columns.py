"""An enrichment's records as item columns, for the consumers that read them.

`item_metadata.parquet` (written by `recsys.enrich.run`) holds one row per item; its valid records become columns
`llm_category`, `llm_brand`, `llm_keywords` (joined by ", "), `llm_description` (strings) and `llm_queries` (a list)
of the items table. A consumer reads them by name, switched on in its own config section:
- the text embedded for content vectors and semantic IDs (and so the features of a ranker that reads content):
  `content.text_fields: [title, llm_keywords, ...]`;
- the query-aware model's training queries: `model.training.llm_queries: true` (its shopper queries beside the
  title-derived ones).
An item without a valid record has nulls there (a failed answer is never read as one).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import polars as pl

from recsys.data.schema import ITEM_ID
from recsys.enrich.record import FIELDS
from recsys.errors import DataError

PREFIX = "llm_"
COLUMNS = tuple(PREFIX + field for field in FIELDS)
LLM_QUERIES = PREFIX + "queries"
KEYWORD_SEPARATOR = ", "


def metadata_fields(fields: Iterable[str]) -> list[str]:
    """The names in `fields` that are metadata columns (`llm_...`)."""
    return [field for field in fields if field.startswith(PREFIX)]


def unknown_metadata_fields(fields: Iterable[str]) -> list[str]:
    """Names in `fields` that look like metadata columns and are none of them (a typo: `llm_keyword`)."""
    return [field for field in metadata_fields(fields) if field not in COLUMNS]


def metadata_columns(path: Path) -> pl.DataFrame:
    """`item_id` and the `llm_...` columns of the valid records in `path` (an item_metadata.parquet)."""
    if not path.is_file():
        raise DataError(
            path, "no item metadata here", "run the enrich step first (an `enrich` section, or `recsys enrich`)"
        )
    records = pl.read_parquet(path).filter(pl.col("status") == "ok")
    return records.select(
        pl.col(ITEM_ID),
        *(pl.col(field).alias(PREFIX + field) for field in ("category", "brand", "description")),
        pl.col("keywords").list.join(KEYWORD_SEPARATOR).alias(PREFIX + "keywords"),
        pl.col("queries").alias(PREFIX + "queries"),
    )


def with_item_metadata(items: pl.DataFrame, path: Path | None) -> pl.DataFrame:
    """`items` with the metadata columns of `path` joined by item id, in the same row order (None: `items`)."""
    if path is None:
        return items
    return items.join(metadata_columns(path), on=ITEM_ID, how="left", maintain_order="left")
