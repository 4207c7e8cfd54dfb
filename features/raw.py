"""The canonical raw dataset every loader returns (before validation policies, id mapping and splits): in one frame
(`RawDataset`), or read batch by batch for inputs too large to hold (`RawStream`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl


@dataclass(frozen=True)
class RawDataset:
    """Interactions and (optionally) an item catalog in the canonical schema of `recsys.data.schema`.

    Args:
        interactions: user_id str, item_id str, ts int64, optional event/value/domain columns.
        items: item_id str, title str, optional domain/category/brand/description; None if no catalog.
        source: loader name, e.g. "amazon-p5".
        files: the input files read, for provenance in meta.json.
    """

    interactions: pl.DataFrame
    items: pl.DataFrame | None
    source: str
    files: tuple[Path, ...] = field(default_factory=tuple)


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
    """`raw` as a stream: a `RawDataset`'s interactions are one batch, whatever the batch size."""
    if isinstance(raw, RawStream):
        return raw
    return RawStream(lambda _batch_bytes: iter([raw.interactions]), raw.items, raw.source, raw.files)
