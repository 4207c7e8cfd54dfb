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

Inputs of any size: the work runs in passes, so that memory follows a batch or a part, not the input.
1. `features.partitions.split_into_parts` reads the raw stream in batches (`memory_budget_gb` sizes them), turns
   item ids into codes and writes each row to the part of its user, in a scratch directory.
2. Each part, in turn: the loader's per-user check, the per-user policies (`features.policies`); the kept rows
   go back to the scratch directory.
3. Once: the item policies, the users and items with their dense ids, the cold marks, meta.json.
4. Each part, when written: dense ids, sorted by user then time. A small input is one part, written as
   `interactions.parquet`; a large one (`num_parts_for`) is written as `interactions/part-*.parquet`. The parts
   split the users, not the content: the same rows in the same order, whatever the number of parts.

Budgets: after every batch of pass 1 (for the synthetic source, every chunk generated) and every part of passes 2
and 4, the resident memory the prepare added since it started is checked against `memory_budget_gb` (what the
process held before is not charged to it) and the time since the start against
`max_seconds` (`recsys.runtime.budget`): running out is a `BudgetExceeded` naming the knob, and nothing is written.

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
import math
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from features.attributes import AttributeFiles, AttributeTable, join_attributes, read_attributes
from features.io import LINE
from features.partitions import ITEM_CODE, PART, ROW, Parts, split_into_parts
from features.policies import PolicyOutcome, UserPolicyCounts, apply_item_policies, apply_user_policies
from features.raw import RawDataset, RawStream, as_stream, interactions_file
from features.settings import PrepareSettings, UnknownItems
from recsys.data.schema import (
    INTERACTIONS_DIR,
    INTERACTIONS_FILE,
    IS_COLD,
    ITEM_ID,
    ITEM_IDX,
    ITEMS_FILE,
    META_FILE,
    SCHEMA_VERSION,
    TITLE,
    TS,
    USER_ID,
    USER_IDX,
    USERS_FILE,
    optional_interaction_columns,
    part_file_name,
)
from recsys.data.splits import RULE, split_counts
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.budget import Budget, BudgetGuard, Limit, limit
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)

ID_ORDER = "user_idx and item_idx are 1-based in sorted user_id / item_id order; 0 is padding"
# A batch of P5 text peaks at about 25x its size while it is decoded, split into rows and coded (measured): a batch
# of 1/64 of the budget leaves the rest for the item codes, the users' ids and the parts.
BATCH_SHARE_OF_BUDGET = 1 / 64
MAX_BATCH_BYTES = 256 * 2**20  # larger batches read no faster
# Input bytes per part: a part's policies and sort then peak under ~0.5 GB, whatever the budget. The number of parts
# follows the input alone (not the budget), so the same input gives the same files on any machine.
PART_INPUT_BYTES = 16 * 2**20
# what raises each budget, as the error names it
MEMORY_KNOB = "--memory-budget-gb (data.memory_budget_gb in a config)"
SECONDS_KNOB = "--max-seconds"
SCRATCH_DIR = ".scratch"  # inside the temp directory of the atomic write: a killed prepare leaves it nowhere else


def batch_bytes(settings: PrepareSettings) -> int:
    """How many bytes of input a batch reads under `settings.memory_budget_gb`."""
    return int(min(MAX_BATCH_BYTES, max(1.0, settings.memory_budget_gb * 2**30 * BATCH_SHARE_OF_BUDGET)))


def prepare_budget(settings: PrepareSettings) -> Budget:
    """The budget the passes check: the memory budget against the resident memory the prepare adds, and the time
    budget."""
    return Budget(
        "the prepare",
        seconds=limit(settings.max_seconds, SECONDS_KNOB),
        memory_gb=Limit(settings.memory_budget_gb, MEMORY_KNOB),
        memory_from_start=True,
    )


def num_parts_for(stream: RawStream) -> int:
    """How many parts the interactions of `stream` are written in: one per `PART_INPUT_BYTES` of input, one for an
    input of unknown size (an in-memory `RawDataset`)."""
    if stream.size_bytes is None:
        return 1
    return max(1, math.ceil(stream.size_bytes / PART_INPUT_BYTES))


@dataclass(frozen=True)
class LoadedCounts:
    """What the loader gave, before the policies.

    Args:
        interactions: rows.
        users: distinct users.
        items: catalog items, or distinct items of the interactions without a catalog.
    """

    interactions: int
    users: int
    items: int


@dataclass(frozen=True)
class PreparedData:
    """The tables of a prepared directory: users, items and meta in memory, the interactions in parts.

    Args:
        parts: each part's interactions (user_idx, item_idx, ts + optional columns; sorted by user_idx then ts),
            computed when collected; every row of a user is in one part.
        items: item_idx, item_id, title, is_cold + optional columns; sorted by item_idx.
        users: user_idx, user_id; sorted by user_idx.
        meta: the contents of meta.json.
        loaded: what the loader gave, before the policies.
    """

    parts: tuple[pl.LazyFrame, ...]
    items: pl.DataFrame
    users: pl.DataFrame
    meta: dict[str, Any]
    loaded: LoadedCounts

    @property
    def interactions(self) -> pl.DataFrame:
        """Every part in one frame, sorted by user_idx then ts: the whole table (for small data)."""
        return pl.concat([part.collect() for part in self.parts]).sort(USER_IDX, maintain_order=True)


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
        loaded: what the loader gave, before the policies.
    """

    out_dir: Path | None
    source: str
    num_users: int
    num_items: int
    num_interactions: int
    num_cold_items: int
    policies: tuple[PolicyOutcome, ...]
    loaded: LoadedCounts

    @property
    def split_counts(self) -> dict[str, int]:
        """Interactions per split ("train", "valid", "test")."""
        return split_counts(self.num_interactions, self.num_users)


def prepare(
    raw: RawDataset | RawStream,
    out_dir: Path,
    settings: PrepareSettings | None = None,
    source_options: Mapping[str, Any] | None = None,
    attributes: AttributeFiles | None = None,
) -> PrepareSummary:
    """Apply the policies, map ids, order, mark cold items and write `out_dir` atomically.

    Args:
        raw: a loader's output (a stream for inputs of any size).
        out_dir: the prepared directory; an existing prepared directory there is replaced.
        settings: the policies, the cold-start draw and the budgets; None: the defaults.
        source_options: the loader options, recorded in meta.json for provenance.
        attributes: item attribute files (resolved paths; `features.attributes`), read and checked before anything
            else, joined onto the items; None: none.

    Raises:
        DataError: the data cannot be prepared (see `features.policies`); nothing is written.
        BudgetExceeded: the work ran past `settings.max_seconds` or `.memory_budget_gb`; nothing is written.
    """
    settings = settings or PrepareSettings()
    table = read_attributes(attributes) if attributes is not None else None
    guard = prepare_budget(settings).start()
    try:
        with atomic_directory(out_dir, marker=META_FILE) as tmp:
            prepared = plan_prepared(raw, tmp / SCRATCH_DIR, settings, source_options or {}, guard)
            prepared = add_attributes(prepared, table)
            write_tables(prepared, tmp, guard)
            shutil.rmtree(tmp / SCRATCH_DIR)
    except OSError as err:
        raise DataError(
            out_dir,
            f"cannot write the prepared directory: {_why_unwritable(out_dir, err)}",
            "choose an output whose parent is a writable directory (`--out`, or the pipeline's --work-dir)",
        ) from err
    logger.info("wrote %s", out_dir)
    return summarize(prepared, out_dir)


def build_prepared(
    raw: RawDataset | RawStream,
    settings: PrepareSettings | None = None,
    source_options: Mapping[str, Any] | None = None,
    attributes: AttributeFiles | None = None,
) -> PreparedData:
    """Everything `prepare` does except writing, with the tables in memory (for small data; `dry_run` for any size).

    Args: as `prepare`.
    """
    settings = settings or PrepareSettings()
    table = read_attributes(attributes) if attributes is not None else None
    with tempfile.TemporaryDirectory(prefix="recsys-prepare-") as scratch:
        guard = prepare_budget(settings).start()
        prepared = plan_prepared(raw, Path(scratch) / SCRATCH_DIR, settings, source_options or {}, guard)
        prepared = add_attributes(prepared, table)
        return replace(prepared, parts=tuple(part.collect().lazy() for part in prepared.parts))


def dry_run(raw: RawDataset | RawStream, settings: PrepareSettings | None = None) -> PrepareSummary:
    """What `prepare` would write, without writing it (`recsys data validate`): loader, policies, ids and splits
    run, the interactions are not indexed. The intermediate files go to the system's temp directory.

    Args: as `prepare`.
    """
    settings = settings or PrepareSettings()
    with tempfile.TemporaryDirectory(prefix="recsys-prepare-") as scratch:
        guard = prepare_budget(settings).start()
        return summarize(plan_prepared(raw, Path(scratch) / SCRATCH_DIR, settings, {}, guard), None)


def plan_prepared(
    raw: RawDataset | RawStream,
    scratch: Path,
    settings: PrepareSettings,
    source_options: Mapping[str, Any],
    guard: BudgetGuard,
) -> PreparedData:
    """Passes 1-3 (see the module docstring): the prepared tables, the interactions' parts read from `scratch`.

    Args:
        raw: a loader's output.
        scratch: a new directory for the intermediate files; the parts read from it until it is removed.
        settings: how to prepare.
        source_options: the loader options, recorded in meta.json.
        guard: the started budget, checked after each batch and part.

    Raises:
        DataError: the data cannot be prepared; the first problem of the input in file order.
        BudgetExceeded: the budget ran out.
    """
    stream = as_stream(raw)
    num_parts = settings.partitions or num_parts_for(stream)
    parts = split_into_parts(checked_batches(stream, guard), scratch / "parts", num_parts, batch_bytes(settings))
    clean = clean_parts(parts, stream, settings, scratch / "clean", guard)
    used = pl.concat(clean.used_items)
    coded_items, outcomes = apply_item_policies(
        stream.items, parts.items, used, clean.counts, settings, interactions_file(stream)
    )
    users = number_users(clean.users)
    items = number_items(coded_items)
    item_idx_of_code = pl.repeat(None, len(parts.items), dtype=pl.Int32, eager=True).scatter(
        items[ITEM_CODE], items[ITEM_IDX]
    )
    items = mark_cold(items.drop(ITEM_CODE), settings.cold_start_fraction, settings.seed)
    users_of_part = users.partition_by(PART, as_dict=True)  # one pass: a filter per part would read all users each
    no_users = users.clear()
    indexed = tuple(
        index_interactions(path, users_of_part.get((index,), no_users), item_idx_of_code)
        for index, path in enumerate(clean.files)
    )
    num_interactions = sum(count.kept_rows for count in clean.counts)
    meta = build_meta(stream, outcomes, users.height, num_interactions, items, settings, source_options)
    loaded = LoadedCounts(
        interactions=parts.rows,
        users=sum(count.loaded_users for count in clean.counts),
        items=stream.items.height if stream.items is not None else len(parts.items),
    )
    return PreparedData(parts=indexed, items=items, users=users.drop(PART), meta=meta, loaded=loaded)


def add_attributes(prepared: PreparedData, table: AttributeTable | None) -> PreparedData:
    """`prepared` with the attribute columns joined onto its items and meta.json's `attributes` (what each file held
    and which of its ids are not among the items); unchanged without attribute files."""
    if table is None or not table.files:
        return prepared
    items, attributes = join_attributes(prepared.items, table)
    return replace(prepared, items=items, meta={**prepared.meta, "attributes": attributes})


def checked_batches(stream: RawStream, guard: BudgetGuard) -> RawStream:
    """`stream` whose every batch, once read (or generated), is followed by a check of the budget."""

    def batches(batch_bytes: int) -> Iterator[pl.DataFrame]:
        for index, batch in enumerate(stream.batches(batch_bytes), start=1):
            guard.check(f"reading the input, after {index:,} batch(es) of about {batch_bytes / 2**20:,.1f} MB")
            yield batch

    return replace(stream, batches=batches)


@dataclass(frozen=True)
class CleanParts:
    """The parts after the per-user policies.

    Args:
        files: each part's kept rows (user_id, item_code, ts + optional columns), in file order.
        counts: what the policies did to each part.
        users: each part's kept user ids, once each.
        used_items: each part's kept item codes, once each.
    """

    files: tuple[Path, ...]
    counts: tuple[UserPolicyCounts, ...]
    users: tuple[pl.Series, ...]
    used_items: tuple[pl.Series, ...]


def clean_parts(
    parts: Parts, stream: RawStream, policies: PrepareSettings, directory: Path, guard: BudgetGuard
) -> CleanParts:
    """Pass 2: each part through the loader's per-user check and the per-user policies, the kept rows to `directory`.

    Args:
        parts: the interactions split by user.
        stream: the raw stream (its `check_users`, its catalog).
        policies: the settings.
        directory: a new directory for the kept rows.
        guard: the started budget, checked as each part is read.

    Raises:
        DataError: the loader's check failed: of the parts' problems, the one on the earliest line.
        BudgetExceeded: the budget ran out.
    """
    directory.mkdir()
    catalog_size = None if stream.items is None else parts.items.num_catalog
    files, counts, users, used_items, problems = [], [], [], [], []
    progress = Progress(logger, "applying the policies", total=len(parts), unit="parts", rows_are="interactions")
    for index in range(len(parts)):
        rows = parts.read(index)
        guard.check(f"applying the policies, at part {index + 1:,} of {len(parts):,}")
        if stream.check_users is not None:
            try:
                stream.check_users(rows)
            except DataError as problem:
                problems.append(problem)
        if problems:  # only the check runs on, to find the earliest problem
            continue
        kept, count = apply_user_policies(rows, catalog_size, policies)
        path = directory / f"part-{index:05d}.arrow"
        kept.drop(ROW, LINE, strict=False).write_ipc(path, compression="lz4")
        files.append(path)
        counts.append(count)
        users.append(kept.get_column(USER_ID).unique())
        used_items.append(kept.get_column(ITEM_CODE).unique())
        progress.update(done=index + 1, rows=rows.height)
    if problems:
        raise min(problems, key=lambda problem: problem.line or 0)
    progress.finish()
    return CleanParts(tuple(files), tuple(counts), tuple(users), tuple(used_items))


def number_users(part_users: Sequence[pl.Series]) -> pl.DataFrame:
    """user_idx 1..U in sorted user_id order, with the part of each user.

    Args:
        part_users: each part's user ids, once each.
    """
    users = pl.concat(
        pl.DataFrame({USER_ID: ids}).with_columns(pl.lit(index, dtype=pl.UInt32).alias(PART))
        for index, ids in enumerate(part_users)
    ).sort(USER_ID)
    return users.select(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).alias(USER_IDX), USER_ID, PART)


def number_items(items: pl.DataFrame) -> pl.DataFrame:
    """The items with item_idx 1..N first, in sorted item_id order.

    Args:
        items: the items table of the policies (item_code + catalog columns).
    """
    items = items.sort(ITEM_ID)
    return items.select(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).alias(ITEM_IDX), pl.all())


def index_interactions(path: Path, users: pl.DataFrame, item_idx_of_code: pl.Series) -> pl.LazyFrame:
    """Pass 4 of one part: user_id / item_code replaced by their dense ids, sorted by user then time (stable).

    Args:
        path: the part's kept rows, in file order.
        users: user_idx, user_id of (at least) the part's users.
        item_idx_of_code: the item_idx of every item code (null for the items dropped).
    """
    rows = pl.scan_ipc(path)
    names = rows.collect_schema().names()
    optional_columns = optional_interaction_columns()
    optional = [pl.col(name).cast(dtype) for name, dtype in optional_columns.items() if name in names]
    extra = [name for name in names if name not in (USER_ID, ITEM_CODE, TS, *optional_columns)]
    user_idx = pl.col(USER_ID).replace_strict(users[USER_ID], users[USER_IDX], return_dtype=pl.Int32)
    item_idx = pl.lit(item_idx_of_code).gather(pl.col(ITEM_CODE))  # codes are dense: a lookup, no hashing
    indexed = rows.select(
        user_idx.alias(USER_IDX), item_idx.alias(ITEM_IDX), pl.col(TS).cast(pl.Int64), *optional, *extra
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
    stream: RawStream,
    outcomes: tuple[PolicyOutcome, ...],
    num_users: int,
    num_interactions: int,
    items: pl.DataFrame,
    settings: PrepareSettings,
    source_options: Mapping[str, Any],
) -> dict[str, Any]:
    """The contents of meta.json (deterministic: no timestamps, no host names, nothing of the memory budget).

    Args:
        stream: the loader's output (source and input files).
        outcomes: the policies applied, each with its count and first examples (lines and ids, in file order: the
            same whatever the number of parts).
        num_users: users kept.
        num_interactions: interactions kept.
        items: the catalog with is_cold.
        settings: the cold-start settings.
        source_options: the loader options.
    """
    num_cold = int(items.get_column(IS_COLD).sum())
    return {
        "schema_version": SCHEMA_VERSION,
        "source": stream.source,
        "inputs": [path.as_posix() for path in stream.files],
        "source_options": {key: _jsonable(value) for key, value in sorted(source_options.items())},
        "counts": {
            "users": num_users,
            "items": items.height,
            "interactions": num_interactions,
            **split_counts(num_interactions, num_users),
            "cold_items": num_cold,
        },
        "policies": [outcome.to_dict() for outcome in outcomes],
        "cold_start": {"fraction": settings.cold_start_fraction, "seed": settings.seed, "items": num_cold},
        "ids": ID_ORDER,
        "splits": RULE,
    }


def _why_unwritable(out_dir: Path, err: OSError) -> str:
    """What kept `out_dir` from being written: a file where a parent directory should be, else the system's reason."""
    existing = next(parent for parent in out_dir.parents if parent.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    return f"{err.strerror.lower()} ({err.filename})" if err.strerror and err.filename else str(err)


def write_tables(prepared: PreparedData, directory: Path, guard: BudgetGuard) -> None:
    """Write the interactions (one file, or one per part), items/users parquet and meta.json into `directory`
    (deterministic bytes).

    Args:
        prepared: the tables and meta.
        directory: an existing directory, without the files.
        guard: the started budget, checked after each part.
    """
    if len(prepared.parts) == 1:
        _write_parquet(prepared.parts[0].collect(), directory / INTERACTIONS_FILE)
        guard.check("writing the interactions")
    else:
        (directory / INTERACTIONS_DIR).mkdir()
        progress = Progress(
            logger, "writing the interactions", total=len(prepared.parts), unit="parts", rows_are="interactions"
        )
        for index, part in enumerate(prepared.parts):
            rows = part.collect()
            _write_parquet(rows, directory / INTERACTIONS_DIR / part_file_name(index))
            progress.update(done=index + 1, rows=rows.height)
            guard.check(f"writing the interactions, after {index + 1:,} of {len(prepared.parts):,} parts")
        progress.finish()
    _write_parquet(prepared.items, directory / ITEMS_FILE)
    _write_parquet(prepared.users, directory / USERS_FILE)
    text = json.dumps(prepared.meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (directory / META_FILE).write_text(text, encoding="utf-8")


def _write_parquet(table: pl.DataFrame, path: Path) -> None:
    # one chunk: polars cuts row groups at chunk ends, so the bytes would follow how the frame was computed
    table.rechunk().write_parquet(path, compression="zstd", statistics=True)


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
        policies=tuple(PolicyOutcome.from_dict(policy) for policy in prepared.meta["policies"]),
        loaded=prepared.loaded,
    )


def _jsonable(value: Any) -> Any:
    """Paths and enums as strings, everything else unchanged (for meta.json)."""
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, UnknownItems):
        return value.value
    return value
