"""A prepared directory in the P5 / TIGER text form, which `recsys data prepare --source amazon-p5` reads back.

The form (`features.loaders.amazon_p5`): `user_sequence.txt`, one line per user, `USER_ID ITEM_ID ITEM_ID ...` in
time order, and `items.csv` (item_id,title). It holds no timestamps and no event/value columns: read back, it gives
the same users, items and sequences, with ts = the position in the sequence.

Written part by part: memory follows one part of the prepared interactions plus the two id tables, so a prepared
directory of 10^8 interactions gives its multi-GB text form in bounded memory (`benchmarks.scale`, step p5_text).

Example:
    >>> import tempfile
    >>> from features.prepare import prepare
    >>> from features.raw import RawDataset
    >>> rows = {"user_id": ["u"] * 3 + ["v"] * 3, "item_id": list("abcbcd"), "ts": [3, 1, 2, 1, 2, 3]}
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = prepare(RawDataset(pl.DataFrame(rows), None, "example"), root / "prepared")
    >>> export = write_p5(root / "prepared", root / "p5")
    >>> (root / "p5" / "user_sequence.txt").read_text()
    'u b c a\\nv b c d\\n'
    >>> export.users, export.interactions
    (2, 6)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from features.loaders.amazon_p5 import ITEMS_FILE as P5_ITEMS_FILE
from features.loaders.amazon_p5 import SEQUENCE_FILE
from recsys.data.schema import ITEM_ID, ITEM_IDX, ITEMS_FILE, TITLE, USER_ID, USER_IDX, USERS_FILE, interaction_files
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)

LINE_COLUMN = "_line"
_PREPARE_FIX = "pass a directory written by `recsys data prepare` (or prepare the data again)"


@dataclass(frozen=True)
class P5Export:
    """What `write_p5` wrote.

    Args:
        out_dir: the P5 directory.
        users: lines of `user_sequence.txt`.
        interactions: item ids on those lines.
        sequence_bytes: the size of `user_sequence.txt`.
    """

    out_dir: Path
    users: int
    interactions: int
    sequence_bytes: int


def write_p5(data_dir: Path, out_dir: Path) -> P5Export:
    """Write the prepared directory `data_dir` in the P5 form into `out_dir` (atomically).

    Args:
        data_dir: a directory written by `recsys data prepare` (interactions in one file or in parts).
        out_dir: the P5 directory to write; an existing one (holding `user_sequence.txt`) is replaced.

    Raises:
        DataError: a prepared file is missing, or `out_dir` exists and is not a P5 directory.
    """
    files = interaction_files(data_dir)
    items = _read_table(data_dir / ITEMS_FILE, [ITEM_IDX, ITEM_ID, TITLE]).sort(ITEM_IDX)
    users = _read_table(data_dir / USERS_FILE, [USER_IDX, USER_ID]).sort(USER_IDX)
    for path, ids in ((data_dir / ITEMS_FILE, items[ITEM_ID]), (data_dir / USERS_FILE, users[USER_ID])):
        _require_no_whitespace(ids, path)
    progress = Progress(logger, f"writing the P5 form of {data_dir}", total=len(files), unit="parts", rows_are="users")
    interactions = 0
    with atomic_directory(out_dir, marker=SEQUENCE_FILE) as tmp:
        # the loader reads one record per line: a line break in a title becomes a space (as its error advises)
        catalog = items.select(ITEM_ID, pl.col(TITLE).fill_null("").str.replace_all(r"[\r\n]+", " "))
        catalog.write_csv(tmp / P5_ITEMS_FILE)
        with (tmp / SEQUENCE_FILE).open("wb") as sequences:
            for done, path in enumerate(files, start=1):
                part = pl.read_parquet(path, columns=[USER_IDX, ITEM_IDX])
                lines = _sequence_lines(part, users[USER_ID], items[ITEM_ID])
                lines.write_csv(sequences, include_header=False, quote_style="never")
                interactions += part.height
                progress.update(done=done, rows=lines.height)
    progress.finish()
    size = (out_dir / SEQUENCE_FILE).stat().st_size
    logger.info(
        "wrote %s: %d users, %d interactions, %.1f MB of text", out_dir, progress.rows, interactions, size / 1e6
    )
    return P5Export(out_dir, progress.rows, interactions, size)


def _sequence_lines(part: pl.DataFrame, user_ids: pl.Series, item_ids: pl.Series) -> pl.DataFrame:
    """One `USER_ID ITEM_ID ...` line per user of `part` (rows sorted by user_idx then time, as prepared).

    Args:
        part: user_idx, item_idx of one part.
        user_ids: the user ids in user_idx order (user_idx 1 at position 0).
        item_ids: the item ids in item_idx order (item_idx 1 at position 0).
    """
    sequences = (
        pl.DataFrame({USER_IDX: part[USER_IDX], ITEM_ID: item_ids.gather(part[ITEM_IDX] - 1)})
        .group_by(USER_IDX, maintain_order=True)
        .agg(pl.col(ITEM_ID).str.join(" "))
    )
    users = user_ids.gather(sequences[USER_IDX] - 1)
    return pl.DataFrame({LINE_COLUMN: users + " " + sequences[ITEM_ID]})


def _require_no_whitespace(ids: pl.Series, path: Path) -> None:
    """The P5 form splits its lines at whitespace: an id holding some cannot be written."""
    spaced = ids.filter(ids.str.contains(r"\s"))
    if spaced.len():
        raise DataError(
            path,
            f"{spaced.len()} {ids.name}(s) hold whitespace, e.g. {spaced[0]!r}: the P5 form separates ids by spaces",
            f"map the {ids.name}s to ids without whitespace before preparing, or export another form",
        )


def _read_table(path: Path, columns: list[str]) -> pl.DataFrame:
    if not path.is_file():
        raise DataError(path, "prepared data file not found", _PREPARE_FIX)
    return pl.read_parquet(path, columns=columns)
