"""The canonical raw dataset every loader returns (before validation policies, id mapping and splits): in one frame
(`RawDataset`), or read batch by batch for inputs too large to hold (`RawStream`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from features.io import LINE


@dataclass(frozen=True)
class RawDataset:
    """Interactions and (optionally) an item catalog in the canonical schema of `recsys.data.schema`.

    Args:
        interactions: user_id str, item_id str, ts int64, optional event/value/domain columns.
        items: item_id str, title str, optional domain/category/brand/description; None if no catalog.
        source: loader name, e.g. "amazon-p5".
        files: the input files read, for provenance in meta.json.
        lines: the 1-based line of `files[0]` each interaction comes from (u32, one per row), where the input has
            lines; the policies name the lines of the rows they drop. None: no lines (generated data, several files).
    """

    interactions: pl.DataFrame
    items: pl.DataFrame | None
    source: str
    files: tuple[Path, ...] = field(default_factory=tuple)
    lines: pl.Series | None = None


@dataclass(frozen=True)
class RawStream:
    """A `RawDataset` whose interactions are read batch by batch when `features.prepare` asks for them.

    Args:
        batches: batch_bytes -> the interactions in file order, in frames read from about `batch_bytes` bytes of
            input each: the columns of `RawDataset.interactions`, plus `line` (u32, the row's 1-based line) where the
            input has lines. Each call reads the input again; errors in the input are raised when read.
        items: the item catalog (small: read when the stream is opened), or None.
        source: loader name, e.g. "amazon-p5".
        files: the input files, for provenance in meta.json.
        size_bytes: how many bytes the batches read in all, known before reading (it sizes the prepared
            directory's parts); None: unknown, the interactions are small.
        check_users: a check that needs all the rows of a user (with `line`), e.g. that a P5 user is on one line:
            called on the rows of each set of users; raises `DataError`. None: no such check.
    """

    batches: Callable[[int], Iterator[pl.DataFrame]]
    items: pl.DataFrame | None
    source: str
    files: tuple[Path, ...] = field(default_factory=tuple)
    size_bytes: int | None = None
    check_users: Callable[[pl.DataFrame], None] | None = None


def interactions_file(raw: RawDataset | RawStream) -> Path:
    """The file that errors about the interactions name: the first input file, else the source's name."""
    return raw.files[0] if raw.files else Path(raw.source)


def as_stream(raw: RawDataset | RawStream) -> RawStream:
    """`raw` as a stream: a `RawDataset`'s interactions (with `line`, when it has lines) are one batch, whatever the
    batch size."""
    if isinstance(raw, RawStream):
        return raw
    return RawStream(lambda _batch_bytes: iter([interaction_rows(raw)]), raw.items, raw.source, raw.files)


def interaction_rows(raw: RawDataset) -> pl.DataFrame:
    """The interactions of `raw`, with `line` (u32) first when the loader recorded the lines, as a stream's batches.

    Example:
        >>> rows = pl.DataFrame({"user_id": ["u"], "item_id": ["a"], "ts": [1]})
        >>> interaction_rows(RawDataset(rows, None, "demo", lines=pl.Series([3]))).rows()
        [(3, 'u', 'a', 1)]
    """
    if raw.lines is None:
        return raw.interactions
    return pl.concat([raw.lines.cast(pl.UInt32).alias(LINE).to_frame(), raw.interactions], how="horizontal")
