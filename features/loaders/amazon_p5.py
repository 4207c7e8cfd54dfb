"""Amazon reviews in the P5 / TIGER form: `user_sequence.txt` (+ optional `items.csv`).

`user_sequence.txt` has one user per line, `USER_ID ITEM_ID ITEM_ID ...`, items in chronological
order; there are no timestamps, so `ts` is the position in the user's sequence (0, 1, ...): never negative and far
below `MAX_TIMESTAMP`, so unlike the unix times of the other loaders it needs no bound check.
`items.csv` is a quoted CSV with header `item_id,title`.

`open_amazon_p5` reads the sequences batch by batch (what `recsys data prepare` uses, for files of any size);
`load_amazon_p5` reads them into one frame.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "user_sequence.txt").write_text("u1 a b c\\nu2 b c d\\n")
    >>> raw = load_amazon_p5(folder, domain="toys")
    >>> raw.interactions.rows()[:2]
    [('u1', 'a', 0, 'toys'), ('u1', 'b', 1, 'toys')]
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import polars as pl

from features.io import (
    LINE,
    TEXT,
    fail_on_first,
    input_size,
    locate,
    locate_optional,
    not_read_by,
    read_csv_catalog,
    read_line_batches,
    require_unique,
)
from features.raw import RawDataset, RawStream
from recsys.data.schema import DOMAIN, ITEM_ID, TITLE, TS, USER_ID
from recsys.errors import DataError

SOURCE = "amazon-p5"
DOMAINS_SOURCE = "amazon-p5-domains"
SEQUENCE_FILE = "user_sequence.txt"
ITEMS_FILE = "items.csv"
LOAD_BATCH_BYTES = 64 * 2**20  # `load_amazon_p5` holds every row anyway; batches only bound the parsing's copies


def open_amazon_p5(path: Path, *, domain: str | None = None) -> RawStream:
    """Open a P5-form directory (or its `user_sequence.txt`): the catalog is read now, the sequences batch by batch.

    Args:
        path: the directory holding `user_sequence.txt` (and maybe `items.csv`), or the sequence file.
        domain: the `domain` value of every row; default: the directory name without an "amazon-"
            prefix (`amazon-beauty` -> "beauty").

    Raises:
        DataError: a missing or unreadable file, a file other than `user_sequence.txt`, or a malformed
            `items.csv`; the sequences' problems (see `load_amazon_p5`) are raised as the batches are read, a user
            id on two lines by `check_users`.
    """
    sequences = locate(path, [SEQUENCE_FILE], SOURCE)
    folder = sequences.parent
    domain = domain if domain is not None else folder.resolve().name.removeprefix("amazon-")
    catalog_file = locate_optional(folder, [ITEMS_FILE])
    items = None
    if catalog_file is not None:
        items = read_csv_catalog(catalog_file, {ITEM_ID: ITEM_ID, TITLE: TITLE})
        items = items.with_columns(pl.lit(domain).alias(DOMAIN))
    files = (sequences,) if catalog_file is None else (sequences, catalog_file)

    def batches(batch_bytes: int) -> Iterator[pl.DataFrame]:
        for lines in read_line_batches(sequences, batch_bytes):
            yield parse_sequences(lines, sequences).with_columns(pl.lit(domain).alias(DOMAIN))

    return RawStream(
        batches,
        items,
        SOURCE,
        files,
        size_bytes=input_size(sequences),
        check_users=partial(require_one_line_per_user, path=sequences),
    )


def load_amazon_p5(path: Path, *, domain: str | None = None) -> RawDataset:
    """Load a P5-form directory (or its `user_sequence.txt`) into the canonical schema, in one frame.

    Args:
        path: the directory holding `user_sequence.txt` (and maybe `items.csv`), or the sequence file.
        domain: the `domain` value of every row; default: the directory name without an "amazon-"
            prefix (`amazon-beauty` -> "beauty").

    Raises:
        DataError: missing/unreadable/empty/non-UTF-8 file, a file other than `user_sequence.txt`, a line with
            only a user id, a user id on two lines, or a malformed `items.csv`.
    """
    stream = open_amazon_p5(path, domain=domain)
    sequences = stream.files[0]
    rows = pl.concat(stream.batches(LOAD_BATCH_BYTES))
    require_one_line_per_user(rows, sequences)
    return RawDataset(rows.drop(LINE), stream.items, SOURCE, stream.files, lines=rows.get_column(LINE))


def parse_sequences(lines: pl.DataFrame, path: Path) -> pl.DataFrame:
    """`USER_ID ITEM_ID ...` lines into (line, user_id, item_id, ts = position) rows, in file order.

    Args:
        lines: `text_lines` of the sequence file (or a batch of them).
        path: the sequence file, for errors.

    Raises:
        DataError: a line with only a user id.
    """
    rows = lines.select(LINE, pl.col(TEXT).str.extract_all(r"\S+").alias("_fields"))
    fail_on_first(
        rows,
        pl.col("_fields").list.len() < 2,
        path,
        lambda row: f"user {row['_fields'][0]!r} has no items (expected 'USER_ID ITEM_ID ITEM_ID ...')",
        "add the user's items to the line, or remove the line",
    )
    items = pl.col("_fields").list.slice(1)
    return rows.select(
        LINE,
        pl.col("_fields").list.first().alias(USER_ID),
        items.alias(ITEM_ID),
        pl.int_ranges(items.list.len(), dtype=pl.Int64).alias(TS),
    ).explode(ITEM_ID, TS)


def require_one_line_per_user(rows: pl.DataFrame, path: Path) -> None:
    """Each user id on one line only (`require_unique`: the error names the first line that repeats a user).

    Args:
        rows: `parse_sequences` rows of whole lines (all the lines of the users they hold, in file order).
        path: the sequence file, for errors.
    """
    require_unique(rows.filter(pl.col(TS) == 0).select(LINE, USER_ID), path, USER_ID, "user id")


def load_amazon_p5_domains(path: Path, *, domains: list[str] | None = None) -> RawDataset:
    """Several P5-form directories as the domains of one dataset (MLoRA-style multi-domain training).

    User and item ids get a "<domain>:" prefix: P5 numbers users and items per dataset, so "12" of Beauty and
    "12" of Sports are different people and products. A domain without `items.csv` gets a catalog of its item
    ids with empty titles, so no domain's items are dropped as unknown.

    Args:
        path: the parent directory of the domain directories (e.g. `../shared/data`).
        domains: the subdirectory names to load (e.g. ["amazon-beauty", "amazon-sports"]); default: every
            subdirectory holding `user_sequence.txt`. The domain name drops an "amazon-" prefix.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> for name, line in (("amazon-toys", "1 a b c"), ("amazon-games", "1 a d e")):
        ...     (root / name).mkdir()
        ...     _ = (root / name / "user_sequence.txt").write_text(line + "\\n")
        >>> raw = load_amazon_p5_domains(root)
        >>> raw.interactions.unique("user_id", maintain_order=True).rows()
        [('games:1', 'games:a', 0, 'games'), ('toys:1', 'toys:a', 0, 'toys')]
    """
    root = Path(path)
    if root.is_file():
        raise not_read_by(root, DOMAINS_SOURCE, f"one P5 folder per domain (each holding {SEQUENCE_FILE})")
    if not root.is_dir():
        raise DataError(root, "no such file or directory", "check the --input path")
    names = domains if domains is not None else sorted(p.name for p in root.iterdir() if (p / SEQUENCE_FILE).is_file())
    if not names:
        raise DataError(root, f"no domain directories holding {SEQUENCE_FILE}", "pass the parent of the P5 folders")
    interactions: list[pl.DataFrame] = []
    catalogs: list[pl.DataFrame] = []
    files: list[Path] = []
    for name in names:
        raw = load_amazon_p5(root / name)
        domain = raw.interactions[DOMAIN][0]
        prefix = [pl.lit(f"{domain}:") + pl.col(USER_ID), pl.lit(f"{domain}:") + pl.col(ITEM_ID)]
        interactions.append(raw.interactions.with_columns(prefix[0].alias(USER_ID), prefix[1].alias(ITEM_ID)))
        items = raw.items
        if items is None:
            items = raw.interactions.select(pl.col(ITEM_ID).unique(maintain_order=True)).with_columns(
                pl.lit("").alias(TITLE), pl.lit(domain).alias(DOMAIN)
            )
        catalogs.append(items.with_columns((pl.lit(f"{domain}:") + pl.col(ITEM_ID)).alias(ITEM_ID)))
        files.extend(raw.files)
    return RawDataset(
        interactions=pl.concat(interactions),
        items=pl.concat(catalogs, how="diagonal"),
        source=DOMAINS_SOURCE,
        files=tuple(files),
    )
