"""Optional item attribute files, read at prepare time and joined onto the prepared items (docs/data.md, "Item
attributes").

An attribute file is a quoted CSV, one item a line, its header `item_id` and one value column:

| kind | value column (either name) | items.parquet column |
|---|---|---|
| `categories` | `categories` or `category`: levels joined by " > " (`Beauty > Makeup`) | `category_path` list[str] |
| `names` | `name` or `title`: a short name of the item | `name` str |

Checked like every input (`features.io`): UTF-8 (gzip read too), quoting, the header, every row's id and value
non-empty, an id once, a value at most `MAX_VALUE_CHARS`, a path of 1 to `MAX_CATEGORY_LEVELS` non-empty levels of at
most `MAX_LEVEL_CHARS` each, written with the separator " > " (a level holding ">" is a separator without its
spaces). The first bad row is a `DataError` naming the file, its line and the fix. Ids that are not among the
prepared items (never in the data, or dropped by the policies) are counted and named in meta.json (`attributes`)
and the log, not refused; a prepared item absent from a file has a null value.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "cats.csv").write_text("item_id,categories\\na,Beauty > Makeup\\nz,Beauty\\n")
    >>> table = read_attributes(AttributeFiles(categories=folder / "cats.csv"))
    >>> table.frame.rows()
    [('a', ['Beauty', 'Makeup']), ('z', ['Beauty'])]
    >>> items = pl.DataFrame({"item_idx": [1, 2], "item_id": ["a", "b"]})
    >>> joined, meta = join_attributes(items, table)
    >>> joined["category_path"].to_list(), meta["categories"]["unknown_items"]["count"]
    ([['Beauty', 'Makeup'], None], 1)
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict

from features.io import LINE, fail_on_first, read_csv_records, read_text, require_unique, require_values
from recsys.data.categories import CATEGORY_PATH, MAX_CATEGORY_LEVELS  # the column and its bound: the library's
from recsys.data.schema import ITEM_ID
from recsys.errors import DataError

logger = logging.getLogger(__name__)

NAME = "name"  # items.parquet: str
SEPARATOR = " > "
MAX_LEVEL_CHARS = 200
MAX_VALUE_CHARS = 2_000  # of a whole value: the longest text the API takes for an item (added items' fields)
MAX_EXAMPLES = 5  # unknown ids named in meta.json and the log

# kind -> (the value column's accepted names, the items.parquet column)
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "categories": (("categories", "category"), CATEGORY_PATH),
    "names": (("name", "title"), NAME),
}


class AttributeFiles(BaseModel):
    """The attribute files of a data set (`data.attributes` in an experiment config): None, not read.

    Args:
        categories: a CSV of `item_id,categories` (category paths).
        names: a CSV of `item_id,name` (or `item_id,title`): short item names.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    categories: Path | None = None
    names: Path | None = None

    def named(self) -> dict[str, Path]:
        """{kind: file} of the files given."""
        return {kind: path for kind in KINDS if (path := getattr(self, kind)) is not None}

    def resolved(self, base: Path | None) -> AttributeFiles:
        """The files with a relative path taken under `base` (the data's input directory), as `items.csv` is."""
        if base is None:
            return self
        return AttributeFiles(
            **{kind: path if path.is_absolute() else base / path for kind, path in self.named().items()}
        )


@dataclass(frozen=True)
class AttributeTable:
    """The attributes read: `frame` (item_id + a column per kind read, all items of any file; null where a file
    lacks the item) and, per kind, its file and each row's id with its line (for naming unknown ids)."""

    frame: pl.DataFrame
    files: dict[str, Path]
    ids: dict[str, pl.DataFrame]  # kind -> line, item_id in file order


def read_attributes(files: AttributeFiles) -> AttributeTable:
    """Read and check every attribute file of `files` (resolved paths).

    Raises:
        DataError: a missing, unreadable or malformed file, naming its first bad line and the fix.
    """
    frame: pl.DataFrame | None = None
    ids: dict[str, pl.DataFrame] = {}
    for kind, path in files.named().items():
        rows = read_attribute_file(kind, path)
        ids[kind] = rows.select(LINE, ITEM_ID)
        values = rows.drop(LINE)
        frame = values if frame is None else frame.join(values, on=ITEM_ID, how="full", coalesce=True)
    if frame is None:
        frame = pl.DataFrame(schema={ITEM_ID: pl.String})
    return AttributeTable(frame, files.named(), ids)


def read_attribute_file(kind: str, path: Path) -> pl.DataFrame:
    """`line`, `item_id` and the kind's column of one attribute file, checked (see the module docstring)."""
    accepted, column = KINDS[kind]
    if not path.is_file():
        raise DataError(path, f"the {kind} attribute file does not exist", f"fix data.attributes.{kind}, or drop it")
    text = read_text(path)
    header = [name.strip() for name in next(csv.reader([text.lstrip("\ufeff").split("\n", 1)[0]]), [])]
    value = next((name for name in accepted if name in header), None)
    if len(header) != 2 or header[0] != ITEM_ID or value is None:
        raise DataError(
            path,
            f"header {header} is not item_id and one {kind} column",
            f"write the header as {ITEM_ID},{accepted[0]} (or {ITEM_ID},{accepted[1]})",
            line=1,
        )
    rows = read_csv_records(text, path, [ITEM_ID, value])
    require_values(rows, path, [ITEM_ID, value])
    require_unique(rows, path, ITEM_ID, "item id")
    fail_on_first(
        rows,
        pl.col(value).str.len_chars() > MAX_VALUE_CHARS,
        path,
        lambda row: f"{value} of item {row[ITEM_ID]!r} has {len(row[value]):,} characters, over {MAX_VALUE_CHARS:,}",
        "shorten it (or remove the line)",
    )
    if kind == "categories":
        return rows.select(LINE, ITEM_ID, _category_levels(rows, path, value).alias(column))
    return rows.select(LINE, ITEM_ID, pl.col(value).alias(column))


def _category_levels(rows: pl.DataFrame, path: Path, value: str) -> pl.Series:
    """Each row's path as its stripped levels; the first row with an empty level, a ">" without its spaces, too many
    levels or a level too long is a `DataError`."""
    levels = rows.select(
        LINE,
        ITEM_ID,
        value,
        pl.col(value).str.split(">").list.eval(pl.element().str.strip_chars()).alias("_levels"),
        pl.col(value).str.split(SEPARATOR).list.len().alias("_spaced"),  # levels as the separator splits them
    )
    checks: list[tuple[pl.Expr, Any, str]] = [
        (
            pl.col("_levels").list.eval(pl.element() == "").list.any(),
            lambda row: f"category path {row[value]!r} of item {row[ITEM_ID]!r} has an empty level",
            f"write the levels joined by {SEPARATOR!r}, none empty (no leading, trailing or doubled separator)",
        ),
        (
            pl.col("_spaced") != pl.col("_levels").list.len(),
            lambda row: f"category path {row[value]!r} of item {row[ITEM_ID]!r} has a '>' without spaces around it",
            f"separate the levels by {SEPARATOR!r} (a space on each side)",
        ),
        (
            pl.col("_levels").list.len() > MAX_CATEGORY_LEVELS,
            lambda row: (
                f"category path of item {row[ITEM_ID]!r} has {len(row['_levels'])} levels, over {MAX_CATEGORY_LEVELS}"
            ),
            f"keep the top {MAX_CATEGORY_LEVELS} levels",
        ),
        (
            pl.col("_levels").list.eval(pl.element().str.len_chars() > MAX_LEVEL_CHARS).list.any(),
            lambda row: f"a level of item {row[ITEM_ID]!r}'s category path is over {MAX_LEVEL_CHARS} characters",
            "shorten the level",
        ),
    ]
    for bad, problem, fix in checks:
        fail_on_first(levels, bad, path, problem, fix)
    return levels.get_column("_levels")


def join_attributes(items: pl.DataFrame, table: AttributeTable) -> tuple[pl.DataFrame, dict[str, Any]]:
    """`items` (the prepared catalogue, by item_id) with the attribute columns, and what meta.json records of each
    file: its rows, the items it covers, and its ids not among `items` (count and the first, by line), also logged.
    """
    joined = items.join(table.frame, on=ITEM_ID, how="left", maintain_order="left")
    known = items.select(ITEM_ID)
    meta: dict[str, Any] = {}
    for kind, path in table.files.items():
        column = KINDS[kind][1]
        unknown = table.ids[kind].join(known, on=ITEM_ID, how="anti", maintain_order="left")
        examples = unknown.head(MAX_EXAMPLES).rows(named=True)
        meta[kind] = {
            "file": path.as_posix(),
            "column": column,
            "rows": table.ids[kind].height,
            "items_with_value": int(joined.get_column(column).is_not_null().sum()),
            "unknown_items": {"count": unknown.height, "examples": examples},
        }
        if unknown.height:
            shown = "; ".join(f"line {row[LINE]}: {row[ITEM_ID]!r}" for row in examples)
            logger.warning(
                "%s: %d item ids are not among the prepared items (not in the data, or dropped by the policies), "
                "ignored; e.g. %s",
                path,
                unknown.height,
                shown,
            )
    return joined, meta
