"""Data policies: what happens to duplicates, unknown items and short histories, in one place.

The policies run after a loader and before id mapping, in this order:

1. duplicate_interactions: exact duplicate (user_id, item_id, ts) rows are dropped, the first kept.
2. unknown_items: interactions whose item is not in the catalog are dropped ("drop", default), kept
   with an empty title ("keep"), or rejected ("error"). Without a catalog every item is known and
   gets an empty title.
3. min_interactions: users with fewer than `min_interactions` interactions (after 1-2) are dropped;
   leave-one-out needs at least 3 (train + valid + test).
4. items_without_interactions: catalog items nobody interacted with (after 1-3) are dropped.

Steps 1-3 look at one user at a time, so `apply_user_policies` runs them on each part of the interactions
(`features.partitions`: every row of a user is in one part, item ids are codes); `apply_item_policies` then does
what needs every part (the catalog side of step 2, step 4, the counts) and returns a `PolicyOutcome`
(name, setting, count) per step, logged and stored in meta.json. `apply_policies` runs both on one in-memory dataset.
Loader-level problems (a user id on two P5 lines, an item id twice in a catalog) are errors, not policies.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from features.io import LINE
from features.partitions import ITEM_CODE, ROW, ItemCodes
from features.raw import RawDataset, interactions_file
from features.settings import PrepareSettings, UnknownItems
from recsys.data.schema import ITEM_ID, TS, USER_ID
from recsys.errors import DataError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyOutcome:
    """One applied policy.

    Args:
        name: the policy, e.g. "min_interactions".
        setting: its setting, e.g. "3" or "drop".
        count: how many rows/users/items it affected (see `detail`).
        detail: what was counted, in words.
    """

    name: str
    setting: str
    count: int
    detail: str

    def to_dict(self) -> dict[str, str | int]:
        """JSON-ready form for meta.json."""
        return asdict(self)


@dataclass(frozen=True)
class UserPolicyCounts:
    """What steps 1-3 did to one part of the interactions.

    Args:
        loaded_rows: the part's interactions before the policies.
        loaded_users: its users before the policies.
        kept_rows: its interactions after them.
        duplicates: duplicate rows dropped.
        unknown_rows: interactions whose item is not in the catalog (after step 1).
        first_unknown: under "error", the first of those rows (row, user_id, item_code, line...), else None.
        short_users: users dropped for too few interactions.
        short_rows: their interactions.
    """

    loaded_rows: int
    loaded_users: int
    kept_rows: int
    duplicates: int
    unknown_rows: int
    first_unknown: dict[str, Any] | None
    short_users: int
    short_rows: int


def apply_user_policies(
    rows: pl.DataFrame, catalog_size: int | None, policies: PrepareSettings
) -> tuple[pl.DataFrame, UserPolicyCounts]:
    """Steps 1-3 on the rows of a set of users (all the rows of each), in file order; returns the kept rows.

    Args:
        rows: `row`, user_id, item_code, ts and other columns (a part of `features.partitions`).
        catalog_size: the codes below it are the catalog's items (`ItemCodes.num_catalog`); None: no catalog.
        policies: the prepare's settings (its min_interactions and unknown_items).
    """
    unique = rows.unique(subset=[USER_ID, ITEM_CODE, TS], keep="first", maintain_order=True)
    known, unknown_rows, first_unknown = unique, 0, None
    if catalog_size is not None:
        unknown = pl.col(ITEM_CODE) >= catalog_size
        missing = unique.filter(unknown)
        unknown_rows = missing.height
        if policies.unknown_items is UnknownItems.ERROR and missing.height:
            first_unknown = missing.row(0, named=True)
        if policies.unknown_items is UnknownItems.DROP:
            known = unique.filter(~unknown)
    kept = known.filter(pl.len().over(USER_ID) >= policies.min_interactions)
    counts = UserPolicyCounts(
        loaded_rows=rows.height,
        loaded_users=rows.get_column(USER_ID).n_unique(),
        kept_rows=kept.height,
        duplicates=rows.height - unique.height,
        unknown_rows=unknown_rows,
        first_unknown=first_unknown,
        short_users=known.get_column(USER_ID).n_unique() - kept.get_column(USER_ID).n_unique(),
        short_rows=known.height - kept.height,
    )
    return kept, counts


def apply_item_policies(
    catalog: pl.DataFrame | None,
    codes: ItemCodes,
    used: pl.Series,
    parts: Sequence[UserPolicyCounts],
    policies: PrepareSettings,
    origin: Path,
) -> tuple[pl.DataFrame, tuple[PolicyOutcome, ...]]:
    """What needs every part, once `apply_user_policies` ran on each: the items table and every step's outcome, logged.

    Args:
        catalog: the loader's item catalog, or None.
        codes: the item codes of the interactions.
        used: the item codes of the kept interactions (repeats allowed).
        parts: what `apply_user_policies` did to each part.
        policies: the prepare's settings (its min_interactions and unknown_items).
        origin: the interactions file, for errors.

    Returns:
        the items (item_code, then the catalog's columns) that kept interactions name, and the four outcomes.

    Raises:
        DataError: unknown items under the "error" policy, or nothing left after the policies.
    """
    duplicates = PolicyOutcome(
        "duplicate_interactions", "drop", sum(part.duplicates for part in parts), "exact duplicate rows dropped"
    )
    items, unknown = resolve_unknown_items(catalog, codes, parts, policies.unknown_items, origin)
    minimum = policies.min_interactions
    short = PolicyOutcome(
        "min_interactions",
        str(minimum),
        sum(part.short_users for part in parts),
        f"users with fewer than {minimum} interactions dropped ({sum(part.short_rows for part in parts)} rows)",
    )
    used_items = items.filter(pl.col(ITEM_CODE).is_in(used.unique().implode()))
    detail = "catalog items without interactions dropped"
    unused = PolicyOutcome("items_without_interactions", "drop", items.height - used_items.height, detail)
    outcomes = (duplicates, unknown, short, unused)
    for outcome in outcomes:
        logger.info("policy %s=%s: %d %s", outcome.name, outcome.setting, outcome.count, outcome.detail)
    if sum(part.kept_rows for part in parts) == 0:
        raise DataError(
            origin,
            f"no interactions left after the policies ({sum(part.loaded_rows for part in parts)} loaded)",
            "lower --min-interactions, or check that the catalog matches the interactions",
        )
    return used_items, outcomes


def resolve_unknown_items(
    catalog: pl.DataFrame | None,
    codes: ItemCodes,
    parts: Sequence[UserPolicyCounts],
    policy: UnknownItems,
    origin: Path,
) -> tuple[pl.DataFrame, PolicyOutcome]:
    """The catalog side of the unknown-items policy: the items table (item_code first) and the outcome; without a
    catalog, one is built from the interactions (empty titles).

    Args:
        catalog: the loader's item catalog, or None.
        codes: the item codes of the interactions (the catalog's first).
        parts: what `apply_user_policies` did to each part.
        policy: drop | keep | error.
        origin: the interactions file, for errors.
    """
    others = codes.others()
    if catalog is None:
        detail = "no item catalog: all items taken from the interactions, with empty titles"
        return others, PolicyOutcome("unknown_items", policy.value, 0, detail)
    catalog = catalog.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias(ITEM_CODE), pl.all())
    unknown_rows = sum(part.unknown_rows for part in parts)
    detail = f"interactions with items absent from the catalog ({others.height} items)"
    outcome = PolicyOutcome("unknown_items", policy.value, unknown_rows, f"{detail}, {_VERB[policy]}")
    if unknown_rows == 0 or policy is UnknownItems.KEEP:
        items = pl.concat([catalog, others], how="diagonal_relaxed")
        return _fill_text(items), outcome
    if policy is UnknownItems.DROP:
        return catalog, outcome
    first = min((part.first_unknown for part in parts if part.first_unknown), key=lambda row: row[ROW])
    item = others.filter(pl.col(ITEM_CODE) == first[ITEM_CODE]).item(0, ITEM_ID)
    raise DataError(
        origin,
        f"item {item!r} of user {first[USER_ID]!r} (interaction {first[ROW] + 1}) is not in the "
        f"item catalog; {unknown_rows} interactions name {others.height} unknown items",
        "add the items to the catalog, or pass --unknown-items drop (or keep)",
        line=first.get(LINE),
    )


_VERB = {
    UnknownItems.DROP: "dropped",
    UnknownItems.KEEP: "kept with empty titles",
    UnknownItems.ERROR: "rejected",
}


@dataclass(frozen=True)
class CleanDataset:
    """A loader's output after the policies: interactions in file order and the matching catalog.

    Args:
        interactions: user_id, item_id, ts + optional columns; every user has >= min_interactions rows.
        items: item_id, title + optional columns; exactly the items of `interactions`.
        outcomes: the policies applied, in order.
    """

    interactions: pl.DataFrame
    items: pl.DataFrame
    outcomes: tuple[PolicyOutcome, ...]


def apply_policies(raw: RawDataset, policies: PrepareSettings) -> CleanDataset:
    """Apply the policies of this module to one in-memory dataset, in order, logging each count (`features.prepare`
    runs the same steps part by part).

    Args:
        raw: a loader's output.
        policies: the prepare's settings (its min_interactions and unknown_items).

    Raises:
        DataError: unknown items under the "error" policy, or nothing left after the policies.
    """
    origin = interactions_file(raw)
    codes = ItemCodes(raw.items)
    rows = codes.encode(raw.interactions.with_row_index(ROW))
    catalog_size = None if raw.items is None else codes.num_catalog
    kept, counts = apply_user_policies(rows, catalog_size, policies)
    items, outcomes = apply_item_policies(raw.items, codes, kept.get_column(ITEM_CODE), [counts], policies, origin)
    ids = codes.ids()
    item_ids = pl.col(ITEM_CODE).replace_strict(ids[ITEM_CODE], ids[ITEM_ID], return_dtype=pl.String).alias(ITEM_ID)
    interactions = kept.select(item_ids if name == ITEM_CODE else pl.col(name) for name in kept.columns if name != ROW)
    return CleanDataset(interactions=interactions, items=items.drop(ITEM_CODE), outcomes=outcomes)


def _fill_text(items: pl.DataFrame) -> pl.DataFrame:
    """Empty strings instead of nulls in the catalog's text columns."""
    return items.with_columns(pl.col(pl.String).fill_null(""))
