"""The canonical raw dataset every loader returns (before validation policies, id mapping and splits)."""

from __future__ import annotations

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
