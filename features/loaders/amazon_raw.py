"""Amazon reviews as published: `reviews_<Category>[_5].json(.gz)` + optional `meta_<Category>.json(.gz)`.

Reviews: one JSON object per line; the loader reads `reviewerID`, `asin`, `unixReviewTime`, `overall`
(value = the star rating, finite; event = "review"; ts = `unixReviewTime`, held to 0..`MAX_TIMESTAMP` as the API
holds it). Meta: one object per line with `asin`, `title`,
`categories` (a list of category paths), `brand`, `description`; the 2014 meta files are Python
dict literals rather than JSON, which the parser accepts too. category = the first category path
joined with " > " (e.g. "Beauty > Skin Care > Face").

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> line = '{"reviewerID": "u1", "asin": "a", "unixReviewTime": 1400000000, "overall": 5.0}'
    >>> _ = (folder / "reviews_Toys_5.json").write_text(line + "\\n")
    >>> load_amazon_raw(folder).interactions.rows()
    [('u1', 'a', 1400000000, 'review', 5.0, 'toys')]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from features.io import (
    LINE,
    catalog_frame,
    json_string_fields,
    not_read_by,
    parse_numbers,
    parse_records,
    read_text,
    require_values,
    text_lines,
)
from features.raw import RawDataset
from recsys.data.schema import DOMAIN, EVENT, ITEM_ID, TITLE, TS, USER_ID, VALUE
from recsys.errors import DataError

SOURCE = "amazon-raw"
EVENT_NAME = "review"
REVIEW_FIELDS = {"reviewerID": USER_ID, "asin": ITEM_ID, "unixReviewTime": TS, "overall": VALUE}
META_FIELDS = {
    "asin": ITEM_ID,
    "title": TITLE,
    "category": "category",
    "brand": "brand",
    "description": "description",
}
REVIEWS_NAME = re.compile(r"^reviews_(?P<category>.+?)(?:_5)?\.json(?:\.gz)?$")


def load_amazon_raw(path: Path, *, domain: str | None = None) -> RawDataset:
    """Load Amazon review (+ meta) files into the canonical schema.

    Args:
        path: a `reviews_*.json(.gz)` file, or a directory holding exactly one; the meta file
            `meta_<Category>.json(.gz)` is looked up beside it and is optional.
        domain: the `domain` of every row; default: the category of the file name, lower-cased
            (`reviews_Beauty_5.json.gz` -> "beauty").

    Raises:
        DataError: missing/empty/non-UTF-8 file, a line that is not an object, a missing field, a rating that is
            not a finite number, or a time that is not an integer in 0..MAX_TIMESTAMP.
    """
    reviews = find_reviews_file(path)
    category = _category(reviews)
    domain = domain if domain is not None else category.lower()
    rows = read_reviews(reviews)
    interactions = rows.drop(LINE).with_columns(pl.lit(domain).alias(DOMAIN))
    meta = find_meta_file(reviews.parent, category)
    items = None if meta is None else read_meta(meta).with_columns(pl.lit(domain).alias(DOMAIN))
    files = (reviews,) if meta is None else (reviews, meta)
    return RawDataset(interactions, items, SOURCE, files, lines=rows.get_column(LINE))


def find_reviews_file(path: Path) -> Path:
    """`path` if it is a reviews file, else the single `reviews_*.json(.gz)` in the directory.

    Args:
        path: a reviews file or a directory.
    """
    if path.is_file():
        if not REVIEWS_NAME.match(path.name):
            raise not_read_by(path, SOURCE, "one reviews_*.json(.gz) (+ its meta_*.json(.gz)), or that file itself")
        return path
    if not path.is_dir():
        raise DataError(path, "no such file or directory", "check the --input path")
    found = sorted(p for p in path.iterdir() if REVIEWS_NAME.match(p.name))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise DataError(
            path,
            f"expected exactly one reviews_*.json(.gz) file, found {len(found)} ({names})",
            "pass the reviews file itself as --input",
        )
    return found[0]


def find_meta_file(folder: Path, category: str) -> Path | None:
    """The `meta_<category>.json(.gz)` beside the reviews, or None.

    Args:
        folder: the reviews file's directory.
        category: the category from the reviews file name.
    """
    for name in (f"meta_{category}.json", f"meta_{category}.json.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def read_reviews(path: Path) -> pl.DataFrame:
    """Read review lines into (line, user_id, item_id, ts, event, value) rows, in file order.

    Args:
        path: the reviews file.
    """
    fields = json_string_fields(text_lines(read_text(path)), path, list(REVIEW_FIELDS))
    require_values(fields, path, list(REVIEW_FIELDS))
    numbers = {"unixReviewTime": pl.Int64(), "overall": pl.Float32()}
    fields = parse_numbers(fields, path, numbers, unix_times=["unixReviewTime"]).rename(REVIEW_FIELDS)
    return fields.select(LINE, USER_ID, ITEM_ID, TS, pl.lit(EVENT_NAME).alias(EVENT), VALUE)


def read_meta(path: Path) -> pl.DataFrame:
    """Read meta lines into an item catalog (item_id, title, category, brand, description).

    Args:
        path: the meta file.
    """
    rows = [(line, *_meta_values(record)) for line, record in parse_records(text_lines(read_text(path)), path)]
    schema = {LINE: pl.UInt32(), **dict.fromkeys(META_FIELDS, pl.String())}
    records = pl.DataFrame(rows, schema=schema, orient="row")
    return catalog_frame(records, path, META_FIELDS)


def _meta_values(record: dict[str, Any]) -> tuple[str | None, ...]:
    """The META_FIELDS values of one meta record as strings.

    category: the first path of the 2014 `categories` (a list of paths), or the 2018 `category`
    (one flat path), joined with " > ". Lists of text (2018 `description`) are joined with spaces.
    """
    paths = record.get("categories")
    path = paths[0] if isinstance(paths, list) and paths and isinstance(paths[0], list) else record.get("category")
    category = " > ".join(str(part) for part in path) if isinstance(path, list) else path
    values = {**record, "category": category}
    return tuple(_text(values.get(key)) for key in META_FIELDS)


def _text(value: Any) -> str | None:
    """A meta value as text: None stays None, lists are joined with spaces."""
    if value is None:
        return None
    if isinstance(value, list):
        return " ".join(str(part) for part in value)
    return str(value)


def _category(reviews: Path) -> str:
    """The category part of a reviews file name ("reviews_Beauty_5.json.gz" -> "Beauty")."""
    match = REVIEWS_NAME.match(reviews.name)
    assert match is not None  # `find_reviews_file` takes no other name
    return match.group("category")
