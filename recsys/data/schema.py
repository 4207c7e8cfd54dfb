"""Canonical data schema (docs/data.md) and the layout of a prepared data directory.

Raw interactions (what every loader returns):
    user_id: str, item_id: str, ts: int64 (unix seconds, or the position in the user's sequence),
    optional event: str, value: float32, domain: str.
Raw items: item_id: str, title: str, optional domain and text fields (category, brand, description).

A prepared directory (written by `recsys data prepare`, read by `recsys.data.prepared`):
    interactions.parquet  user_idx int32, item_idx int32, ts int64, + the optional columns; sorted by user_idx
                          then time (the leave-one-out split is by position: `recsys.data.splits`).
    interactions/         instead of interactions.parquet, for a large input: part-00000.parquet ... part-<P-1>,
                          the same columns; each user's rows are all in one part (users are split by a hash of
                          their id), each part sorted by user_idx then time.
    items.parquet         item_idx int32 (1..N), item_id str, title str, is_cold bool, + optional columns.
    users.parquet         user_idx int32 (1..U), user_id str.
    meta.json             source, inputs, counts, the policies applied with their counts, cold-start settings.
Internal ids are dense and start at 1: index 0 is reserved for padding in every model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from recsys.errors import DataError

if TYPE_CHECKING:
    import polars as pl

USER_ID = "user_id"
ITEM_ID = "item_id"
TS = "ts"
EVENT = "event"
VALUE = "value"
DOMAIN = "domain"
TITLE = "title"
USER_IDX = "user_idx"
ITEM_IDX = "item_idx"
IS_COLD = "is_cold"

PADDING_IDX = 0
# the latest time an interaction may have, in unix seconds (2100-01-01): a larger one is a unit mistake (ms, ns);
# data files and API requests are held to it, and to times >= 0
MAX_TIMESTAMP = 4_102_444_800
MAX_ID_CHARS = 256  # the longest user or item id an API request may send, or a run-time item may have


# the columns' polars types (polars is imported by what reads or writes tables, not by whoever needs a column's name)
def interaction_columns() -> dict[str, pl.DataType]:
    import polars as pl

    return {USER_ID: pl.String(), ITEM_ID: pl.String(), TS: pl.Int64()}


def optional_interaction_columns() -> dict[str, pl.DataType]:
    import polars as pl

    return {EVENT: pl.String(), VALUE: pl.Float32(), DOMAIN: pl.String()}


def item_columns() -> dict[str, pl.DataType]:
    import polars as pl

    return {ITEM_ID: pl.String(), TITLE: pl.String()}


INTERACTIONS_FILE = "interactions.parquet"
INTERACTIONS_DIR = "interactions"  # the parts, when the interactions are split (see the module docstring)
ITEMS_FILE = "items.parquet"
USERS_FILE = "users.parquet"
META_FILE = "meta.json"
METADATA_FILE = "item_metadata.parquet"  # LLM-written records of the items (recsys.enrich)
SCHEMA_VERSION = 1


def part_file_name(index: int) -> str:
    """The file name of part `index` (0-based) in `INTERACTIONS_DIR`; names sort in part order.

    Example:
        >>> part_file_name(3)
        'part-00003.parquet'
    """
    return f"part-{index:05d}.parquet"


PART_FILES = "part-*.parquet"  # the glob of `part_file_name`'s names
PREPARE_HINT = "prepare it with `recsys data prepare --source ... --out DIR`"


def interaction_files(data_dir: Path) -> list[Path]:
    """`interactions.parquet`, or the parts in `interactions/` (a prepare of a large input), in part order;
    `DataError` when there are neither."""
    single = data_dir / INTERACTIONS_FILE
    if single.is_file():
        return [single]
    parts = sorted((data_dir / INTERACTIONS_DIR).glob(PART_FILES))
    if not parts:
        where = f"{INTERACTIONS_DIR}/{PART_FILES}"
        raise DataError(single, f"prepared data file not found (nor its parts, {where})", PREPARE_HINT)
    return parts
