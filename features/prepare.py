"""Raw dataset -> prepared directory: policies, dense ids, chronological order, cold-start marks; atomic.

Conventions (also recorded in meta.json):
- ids: `user_idx` / `item_idx` are 1..U / 1..N in sorted `user_id` / `item_id` order (0 is padding),
  so the mapping depends only on which ids survive the policies, not on file order.
- order: interactions sorted by user_idx then ts; the sort is stable, so equal timestamps keep file order.
- splits: leave-one-out by position in each user's sequence (`recsys.data.splits`, recorded in meta.json).
- cold start: round(cold_start_fraction * N) items drawn with numpy's `default_rng(seed)` get
  `is_cold=True` in items.parquet; removing them from training is the training dataset's job.
- files are written into a temp directory beside `out_dir` and renamed into place; a rerun on the
  same input gives byte-identical files (meta.json holds no timestamps).

Example:
    >>> import tempfile
    >>> rows = {"user_id": ["u"] * 4, "item_id": ["a", "b", "c", "d"], "ts": [1, 2, 3, 4]}
    >>> raw = RawDataset(pl.DataFrame(rows), None, "example")
    >>> summary = prepare(raw, Path(tempfile.mkdtemp()) / "prepared")
    >>> summary.num_items, summary.split_counts
    (4, {'train': 2, 'valid': 1, 'test': 1})
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from features.policies import (
    CleanDataset,
    Policies,
    PolicyOutcome,
    UnknownItems,
    apply_policies,
    parse_unknown_items,
)
from features.raw import RawDataset
from recsys.data.schema import (
    INTERACTIONS_FILE,
    IS_COLD,
    ITEM_ID,
    ITEM_IDX,
    ITEMS_FILE,
    META_FILE,
    OPTIONAL_INTERACTION_COLUMNS,
    SCHEMA_VERSION,
    TITLE,
    TS,
    USER_ID,
    USER_IDX,
    USERS_FILE,
)
from recsys.data.splits import RULE, split_counts
from recsys.errors import ConfigError, DataError
from recsys.runtime.atomic import atomic_directory

logger = logging.getLogger(__name__)

ID_ORDER = "user_idx and item_idx are 1-based in sorted user_id / item_id order; 0 is padding"


@dataclass(frozen=True)
class PreparedData:
    """The four tables of a prepared directory, in memory.

    Args:
        interactions: user_idx, item_idx, ts + optional columns; sorted by user_idx then ts.
        items: item_idx, item_id, title, is_cold + optional columns; sorted by item_idx.
        users: user_idx, user_id; sorted by user_idx.
        meta: the contents of meta.json.
    """

    interactions: pl.DataFrame
    items: pl.DataFrame
    users: pl.DataFrame
    meta: dict[str, Any]


@dataclass(frozen=True)
class PrepareSummary:
    """What `prepare` (or a dry run) produced.

    Args:
        out_dir: the prepared directory, or None when nothing was written.
        source: the loader name.
        num_users: users kept.
        num_items: items kept.
        num_interactions: interactions kept.
        num_cold_items: items marked cold.
        policies: the policies applied, with their counts.
    """

    out_dir: Path | None
    source: str
    num_users: int
    num_items: int
    num_interactions: int
    num_cold_items: int
    policies: tuple[PolicyOutcome, ...]

    @property
    def split_counts(self) -> dict[str, int]:
        """Interactions per split ("train", "valid", "test")."""
        return split_counts(self.num_interactions, self.num_users)


def prepare(
    raw: RawDataset,
    out_dir: Path,
    *,
    min_interactions: int = 3,
    unknown_items: UnknownItems | str = UnknownItems.DROP,
    cold_start_fraction: float = 0.0,
    seed: int = 0,
    source_options: Mapping[str, Any] | None = None,
) -> PrepareSummary:
    """Apply the policies, map ids, order, mark cold items and write `out_dir` atomically.

    Args:
        raw: a loader's output.
        out_dir: the prepared directory; an existing prepared directory there is replaced.
        min_interactions: users with fewer interactions are dropped (>= 3).
        unknown_items: "drop" | "keep" | "error" for items absent from the catalog.
        cold_start_fraction: fraction of items marked cold, in [0, 1).
        seed: seed of the cold-item draw.
        source_options: the loader options, recorded in meta.json for provenance.

    Raises:
        ConfigError: invalid settings.
        DataError: the data cannot be prepared (see `features.policies`); nothing is written.
    """
    prepared = build_prepared(
        raw,
        min_interactions=min_interactions,
        unknown_items=unknown_items,
        cold_start_fraction=cold_start_fraction,
        seed=seed,
        source_options=source_options,
    )
    write_prepared(prepared, out_dir)
    logger.info("wrote %s", out_dir)
    return summarize(prepared, out_dir)


def build_prepared(
    raw: RawDataset,
    *,
    min_interactions: int = 3,
    unknown_items: UnknownItems | str = UnknownItems.DROP,
    cold_start_fraction: float = 0.0,
    seed: int = 0,
    source_options: Mapping[str, Any] | None = None,
) -> PreparedData:
    """Everything `prepare` does except writing (also the dry run of `recsys data validate`).

    Args:
        raw: a loader's output.
        min_interactions: users with fewer interactions are dropped (>= 3).
        unknown_items: "drop" | "keep" | "error".
        cold_start_fraction: fraction of items marked cold, in [0, 1).
        seed: seed of the cold-item draw.
        source_options: the loader options, recorded in meta.json.
    """
    if not 0.0 <= cold_start_fraction < 1.0:
        raise ConfigError(f"cold_start_fraction must be in [0, 1), got {cold_start_fraction}")
    policies = Policies(min_interactions=min_interactions, unknown_items=parse_unknown_items(unknown_items))
    clean = apply_policies(raw, policies)
    users, items = id_maps(clean)
    items = mark_cold(items, cold_start_fraction, seed)
    interactions = index_interactions(clean.interactions, users, items)
    meta = build_meta(raw, clean, interactions, items, cold_start_fraction, seed, source_options or {})
    return PreparedData(interactions=interactions, items=items, users=users, meta=meta)


def id_maps(clean: CleanDataset) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Dense 1-based ids in sorted id order: users (user_idx, user_id) and the catalog with item_idx first.

    Args:
        clean: the dataset after the policies.
    """
    users = clean.interactions.select(pl.col(USER_ID).unique().sort())
    users = users.select(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).alias(USER_IDX), USER_ID)
    items = clean.items.sort(ITEM_ID)
    items = items.select(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).alias(ITEM_IDX), pl.all())
    return users, items


def index_interactions(interactions: pl.DataFrame, users: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """Replace user_id / item_id by their dense ids and sort by user then time (stable).

    Args:
        interactions: clean interactions in file order.
        users: user_idx, user_id.
        items: item_idx, item_id, ...
    """
    optional = [
        pl.col(name).cast(dtype) for name, dtype in OPTIONAL_INTERACTION_COLUMNS.items() if name in interactions
    ]
    extra = [name for name in interactions.columns if name not in (USER_ID, ITEM_ID, TS, *OPTIONAL_INTERACTION_COLUMNS)]
    indexed = interactions.select(
        pl.col(USER_ID).replace_strict(users[USER_ID], users[USER_IDX], return_dtype=pl.Int32).alias(USER_IDX),
        pl.col(ITEM_ID).replace_strict(items[ITEM_ID], items[ITEM_IDX], return_dtype=pl.Int32).alias(ITEM_IDX),
        pl.col(TS).cast(pl.Int64),
        *optional,
        *extra,
    )
    return indexed.sort([USER_IDX, TS], maintain_order=True)


def mark_cold(items: pl.DataFrame, fraction: float, seed: int) -> pl.DataFrame:
    """Add `is_cold`: round(fraction * N) items drawn without replacement by `np.random.default_rng(seed)`.

    Args:
        items: the catalog with item_idx 1..N, sorted by item_idx.
        fraction: share of items to mark, in [0, 1).
        seed: random seed.
    """
    num_cold = round(fraction * items.height)
    chosen = np.random.default_rng(seed).choice(items.height, size=num_cold, replace=False) + 1
    is_cold = pl.col(ITEM_IDX).is_in(pl.Series(chosen, dtype=pl.Int32).implode()).alias(IS_COLD)
    rest = [name for name in items.columns if name not in (ITEM_IDX, ITEM_ID, TITLE)]
    return items.select(ITEM_IDX, ITEM_ID, pl.col(TITLE).fill_null(""), is_cold, *rest)


def build_meta(
    raw: RawDataset,
    clean: CleanDataset,
    interactions: pl.DataFrame,
    items: pl.DataFrame,
    cold_start_fraction: float,
    seed: int,
    source_options: Mapping[str, Any],
) -> dict[str, Any]:
    """The contents of meta.json (deterministic: no timestamps, no host names).

    Args:
        raw: the loader's output (source and input files).
        clean: the policy outcomes.
        interactions: the indexed interactions.
        items: the catalog with is_cold.
        cold_start_fraction: the cold-start setting.
        seed: the cold-start seed.
        source_options: the loader options.
    """
    num_cold = int(items.get_column(IS_COLD).sum())
    num_users = int(interactions.get_column(USER_IDX).n_unique())
    return {
        "schema_version": SCHEMA_VERSION,
        "source": raw.source,
        "inputs": [path.as_posix() for path in raw.files],
        "source_options": {key: _jsonable(value) for key, value in sorted(source_options.items())},
        "counts": {
            "users": num_users,
            "items": items.height,
            "interactions": interactions.height,
            **split_counts(interactions.height, num_users),
            "cold_items": num_cold,
        },
        "policies": [outcome.to_dict() for outcome in clean.outcomes],
        "cold_start": {"fraction": cold_start_fraction, "seed": seed, "items": num_cold},
        "ids": ID_ORDER,
        "splits": RULE,
    }


def write_prepared(prepared: PreparedData, out_dir: Path) -> None:
    """Write the four files into a temp directory beside `out_dir`, then rename it into place.

    Args:
        prepared: the tables and meta.
        out_dir: the final directory (replaced if it is an earlier prepared directory).

    Raises:
        DataError: `out_dir` cannot be written (its parent is a file, or not writable, or the disk is full).
    """
    try:
        with atomic_directory(out_dir, marker=META_FILE) as tmp:
            write_tables(prepared, tmp)
    except OSError as err:
        raise DataError(
            out_dir,
            f"cannot write the prepared directory: {_why_unwritable(out_dir, err)}",
            "choose an output whose parent is a writable directory (`--out`, or the pipeline's --work-dir)",
        ) from err


def _why_unwritable(out_dir: Path, err: OSError) -> str:
    """What kept `out_dir` from being written: a file where a parent directory should be, else the system's reason."""
    existing = next(parent for parent in out_dir.parents if parent.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    return f"{err.strerror.lower()} ({err.filename})" if err.strerror and err.filename else str(err)


def write_tables(prepared: PreparedData, directory: Path) -> None:
    """Write interactions/items/users parquet and meta.json into `directory` (deterministic bytes).

    Args:
        prepared: the tables and meta.
        directory: an existing, empty directory.
    """
    tables = {
        INTERACTIONS_FILE: prepared.interactions,
        ITEMS_FILE: prepared.items,
        USERS_FILE: prepared.users,
    }
    for name, table in tables.items():
        table.write_parquet(directory / name, compression="zstd", statistics=True)
    text = json.dumps(prepared.meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (directory / META_FILE).write_text(text, encoding="utf-8")


def summarize(prepared: PreparedData, out_dir: Path | None) -> PrepareSummary:
    """A `PrepareSummary` of prepared tables.

    Args:
        prepared: the tables and meta.
        out_dir: where they were written, or None.
    """
    counts = prepared.meta["counts"]
    return PrepareSummary(
        out_dir=out_dir,
        source=prepared.meta["source"],
        num_users=counts["users"],
        num_items=counts["items"],
        num_interactions=counts["interactions"],
        num_cold_items=counts["cold_items"],
        policies=tuple(PolicyOutcome(**policy) for policy in prepared.meta["policies"]),
    )


def _jsonable(value: Any) -> Any:
    """Paths and enums as strings, everything else unchanged (for meta.json)."""
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, UnknownItems):
        return value.value
    return value
