"""Data policies: what happens to duplicates, unknown items and short histories, in one place.

`apply_policies` runs after a loader and before id mapping, in this order:

1. duplicate_interactions: exact duplicate (user_id, item_id, ts) rows are dropped, the first kept.
2. unknown_items: interactions whose item is not in the catalog are dropped ("drop", default), kept
   with an empty title ("keep"), or rejected ("error"). Without a catalog every item is known and
   gets an empty title.
3. min_interactions: users with fewer than `min_interactions` interactions (after 1-2) are dropped;
   leave-one-out needs at least 3 (train + valid + test).
4. items_without_interactions: catalog items nobody interacted with (after 1-3) are dropped.

Each step returns a `PolicyOutcome` (name, setting, count) that is logged and stored in meta.json.
Loader-level problems (a user id on two P5 lines, an item id twice in a catalog) are errors, not policies.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import polars as pl

from features.raw import RawDataset
from recsys.data.schema import DOMAIN, ITEM_ID, TITLE, TS, USER_ID
from recsys.data.splits import MIN_INTERACTIONS
from recsys.errors import ConfigError, DataError

logger = logging.getLogger(__name__)


class UnknownItems(StrEnum):
    """What to do with interactions whose item is absent from the catalog."""

    DROP = "drop"
    KEEP = "keep"
    ERROR = "error"


@dataclass(frozen=True)
class Policies:
    """Policy settings.

    Args:
        min_interactions: users with fewer interactions are dropped (>= 3 for leave-one-out).
        unknown_items: "drop" | "keep" | "error".
    """

    min_interactions: int = MIN_INTERACTIONS
    unknown_items: UnknownItems = UnknownItems.DROP

    def __post_init__(self) -> None:
        if self.min_interactions < MIN_INTERACTIONS:
            raise ConfigError(
                f"min_interactions must be >= {MIN_INTERACTIONS} (leave-one-out needs train + valid + "
                f"test), got {self.min_interactions}"
            )
        object.__setattr__(self, "unknown_items", parse_unknown_items(self.unknown_items))  # accept "drop" etc.


def parse_unknown_items(value: UnknownItems | str) -> UnknownItems:
    """The `UnknownItems` policy named `value`.

    Args:
        value: "drop", "keep" or "error" (or the enum member).

    Raises:
        ConfigError: any other value.
    """
    try:
        return UnknownItems(value)
    except ValueError as err:
        valid = ", ".join(policy.value for policy in UnknownItems)
        raise ConfigError(f"unknown_items must be one of {valid}, got {value!r}") from err


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
class CleanDataset:
    """The loader's output after the policies: interactions in file order and the matching catalog.

    Args:
        interactions: user_id, item_id, ts + optional columns; every user has >= min_interactions rows.
        items: item_id, title + optional columns; exactly the items of `interactions`.
        outcomes: the policies applied, in order.
    """

    interactions: pl.DataFrame
    items: pl.DataFrame
    outcomes: tuple[PolicyOutcome, ...]


def apply_policies(raw: RawDataset, policies: Policies) -> CleanDataset:
    """Apply the policies of this module, in order, logging each count.

    Args:
        raw: a loader's output.
        policies: the settings.

    Raises:
        DataError: unknown items under the "error" policy, or nothing left after the policies.
    """
    origin = raw.files[0] if raw.files else Path(raw.source)
    interactions, duplicates = drop_duplicates(raw.interactions)
    interactions, items, unknown = resolve_unknown_items(interactions, raw.items, policies.unknown_items, origin)
    interactions, short = drop_short_users(interactions, policies.min_interactions)
    items, unused = drop_unused_items(items, interactions)
    outcomes = (duplicates, unknown, short, unused)
    for outcome in outcomes:
        logger.info("policy %s=%s: %d %s", outcome.name, outcome.setting, outcome.count, outcome.detail)
    if interactions.height == 0:
        raise DataError(
            origin,
            f"no interactions left after the policies ({raw.interactions.height} loaded)",
            "lower --min-interactions, or check that the catalog matches the interactions",
        )
    return CleanDataset(interactions=interactions, items=items, outcomes=outcomes)


def drop_duplicates(interactions: pl.DataFrame) -> tuple[pl.DataFrame, PolicyOutcome]:
    """Drop exact duplicate (user_id, item_id, ts) rows, keeping the first.

    Args:
        interactions: raw interactions in file order.
    """
    unique = interactions.unique(subset=[USER_ID, ITEM_ID, TS], keep="first", maintain_order=True)
    dropped = interactions.height - unique.height
    return unique, PolicyOutcome("duplicate_interactions", "drop", dropped, "exact duplicate rows dropped")


def resolve_unknown_items(
    interactions: pl.DataFrame, catalog: pl.DataFrame | None, policy: UnknownItems, origin: Path
) -> tuple[pl.DataFrame, pl.DataFrame, PolicyOutcome]:
    """Apply the unknown-items policy; without a catalog, build one from the interactions (empty titles).

    Args:
        interactions: interactions in file order.
        catalog: the loader's item catalog, or None.
        policy: drop | keep | error.
        origin: the interactions file, for errors.
    """
    if catalog is None:
        items = _placeholder_items(interactions)
        detail = "no item catalog: all items taken from the interactions, with empty titles"
        return interactions, items, PolicyOutcome("unknown_items", policy.value, 0, detail)
    unknown = ~pl.col(ITEM_ID).is_in(catalog.get_column(ITEM_ID).implode())
    missing = interactions.with_row_index("_row", offset=1).filter(unknown)
    detail = f"interactions with items absent from the catalog ({missing.get_column(ITEM_ID).n_unique()} items)"
    outcome = PolicyOutcome("unknown_items", policy.value, missing.height, f"{detail}, {_VERB[policy]}")
    if missing.height == 0 or policy is UnknownItems.KEEP:
        items = pl.concat([catalog, _placeholder_items(missing.drop("_row"))], how="diagonal_relaxed")
        return interactions, _fill_text(items), outcome
    if policy is UnknownItems.DROP:
        return interactions.filter(~unknown), catalog, outcome
    first = missing.row(0, named=True)
    num_unknown = missing.get_column(ITEM_ID).n_unique()
    raise DataError(
        origin,
        f"item {first[ITEM_ID]!r} of user {first[USER_ID]!r} (interaction {first['_row']}) is not in the "
        f"item catalog; {missing.height} interactions name {num_unknown} unknown items",
        "add the items to the catalog, or pass --unknown-items drop (or keep)",
    )


_VERB = {
    UnknownItems.DROP: "dropped",
    UnknownItems.KEEP: "kept with empty titles",
    UnknownItems.ERROR: "rejected",
}


def drop_short_users(interactions: pl.DataFrame, min_interactions: int) -> tuple[pl.DataFrame, PolicyOutcome]:
    """Drop users with fewer than `min_interactions` interactions.

    Args:
        interactions: interactions in file order.
        min_interactions: the minimum history length kept.
    """
    keep = interactions.filter(pl.len().over(USER_ID) >= min_interactions)
    users = interactions.get_column(USER_ID).n_unique() - keep.get_column(USER_ID).n_unique()
    rows = interactions.height - keep.height
    detail = f"users with fewer than {min_interactions} interactions dropped ({rows} rows)"
    return keep, PolicyOutcome("min_interactions", str(min_interactions), users, detail)


def drop_unused_items(items: pl.DataFrame, interactions: pl.DataFrame) -> tuple[pl.DataFrame, PolicyOutcome]:
    """Drop catalog items that no remaining interaction names.

    Args:
        items: the catalog.
        interactions: the interactions after the other policies.
    """
    used = items.filter(pl.col(ITEM_ID).is_in(interactions.get_column(ITEM_ID).unique().implode()))
    detail = "catalog items without interactions dropped"
    return used, PolicyOutcome("items_without_interactions", "drop", items.height - used.height, detail)


def _placeholder_items(interactions: pl.DataFrame) -> pl.DataFrame:
    """One catalog row per distinct item of `interactions` (first appearance order), title "", domain kept."""
    columns = [ITEM_ID, *([DOMAIN] if DOMAIN in interactions.columns else [])]
    items = interactions.select(columns).unique(subset=ITEM_ID, keep="first", maintain_order=True)
    return items.with_columns(pl.lit("").alias(TITLE)).select(ITEM_ID, TITLE, *columns[1:])


def _fill_text(items: pl.DataFrame) -> pl.DataFrame:
    """Empty strings instead of nulls in the catalog's text columns."""
    return items.with_columns(pl.col(pl.String).fill_null(""))
