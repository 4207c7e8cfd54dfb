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
what needs every part (the catalog side of step 2, step 4, the counts) and returns a `PolicyOutcome` per step
(name, setting, count and its first `MAX_EXAMPLES` examples), logged and stored in meta.json. A row is named by its
line (where the input has lines, else its 1-based position as loaded, "interaction"), user and item id; a user by
id, the line of its first row dropped and how many rows it had (after steps 1-2); an item by id. The examples are the
first in file order (catalog order for items), the same however the rows were split into parts. `apply_policies`
runs both on one in-memory dataset.
Loader-level problems (a user id on two P5 lines, an item id twice in a catalog) are errors, not policies.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from features.io import LINE
from features.partitions import ITEM_CODE, ROW, ItemCodes
from features.raw import RawDataset, interaction_rows, interactions_file
from features.settings import PrepareSettings, UnknownItems
from recsys.data.schema import ITEM_ID, TS, USER_ID
from recsys.errors import DataError

logger = logging.getLogger(__name__)

MAX_EXAMPLES = 5  # the rows, users or items each outcome names, in the log and in meta.json
INTERACTION = "interaction"  # an example row's 1-based position as loaded, named when the input has no lines
INTERACTIONS = "interactions"  # an example user's number of interactions

Example = dict[str, str | int]  # e.g. {"line": 3, "user_id": "u1", "item_id": "x"}; JSON-ready


@dataclass(frozen=True)
class PolicyOutcome:
    """One applied policy.

    Args:
        name: the policy, e.g. "min_interactions".
        setting: its setting, e.g. "3" or "drop".
        count: how many rows/users/items it affected (see `detail`).
        detail: what was counted, in words.
        examples: the first (up to `MAX_EXAMPLES`) of them, e.g. ({"line": 3, "user_id": "u1", "item_id": "x"},).

    Example:
        >>> user = {"line": 5, "user_id": "u2", "interactions": 2}
        >>> PolicyOutcome("min_interactions", "3", 1, "users dropped", (user,)).text()
        "min_interactions=3: 1 users dropped; e.g. line 5: user 'u2', 2 interactions"
    """

    name: str
    setting: str
    count: int
    detail: str
    examples: tuple[Example, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for meta.json."""
        return {**asdict(self), "examples": [dict(example) for example in self.examples]}

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> PolicyOutcome:
        """The outcome of a meta.json `policies` entry (`to_dict`'s form; one written before examples has none)."""
        return cls(**{**entry, "examples": tuple(entry.get("examples", ()))})

    def text(self) -> str:
        """One line for the log: `name=setting: count detail; e.g. example; example`."""
        text = f"{self.name}={self.setting}: {self.count} {self.detail}"
        return f"{text}; e.g. {'; '.join(map(describe_example, self.examples))}" if self.examples else text


def describe_example(example: Example) -> str:
    """An example in words, where first: "line 3: user 'u1', item 'x'", "item 'z'".

    Args:
        example: a `PolicyOutcome` example.
    """
    where = [f"{key} {example[key]}" for key in (LINE, INTERACTION) if key in example]
    what = [f"user {example[USER_ID]!r}"] if USER_ID in example else []
    what += [f"item {example[ITEM_ID]!r}"] if ITEM_ID in example else []
    what += [f"{example[INTERACTIONS]} interactions"] if INTERACTIONS in example else []
    return ": ".join([*where[:1], ", ".join(what)])


@dataclass(frozen=True)
class UserPolicyCounts:
    """What steps 1-3 did to one part of the interactions.

    Args:
        loaded_rows: the part's interactions before the policies.
        loaded_users: its users before the policies.
        kept_rows: its interactions after them.
        duplicates: duplicate rows dropped.
        duplicate_examples: the first `MAX_EXAMPLES` of them: row, line (where the input has lines), user_id,
            item_code.
        unknown_rows: interactions whose item is not in the catalog (after step 1).
        unknown_examples: the first `MAX_EXAMPLES` of them, columns as `duplicate_examples`.
        short_users: users dropped for too few interactions.
        short_rows: their interactions.
        short_examples: the first `MAX_EXAMPLES` of those users: the first of their rows dropped (row, and line where
            the input has lines), user_id, interactions (how many of their rows were dropped).
    """

    loaded_rows: int
    loaded_users: int
    kept_rows: int
    duplicates: int
    duplicate_examples: pl.DataFrame
    unknown_rows: int
    unknown_examples: pl.DataFrame
    short_users: int
    short_rows: int
    short_examples: pl.DataFrame


def apply_user_policies(
    rows: pl.DataFrame, catalog_size: int | None, policies: PrepareSettings
) -> tuple[pl.DataFrame, UserPolicyCounts]:
    """Steps 1-3 on the rows of a set of users (all the rows of each), in file order; returns the kept rows.

    Args:
        rows: `row`, user_id, item_code, ts and other columns (a part of `features.partitions`).
        catalog_size: the codes below it are the catalog's items (`ItemCodes.num_catalog`); None: no catalog.
        policies: the prepare's settings (its min_interactions and unknown_items).
    """
    first = rows.select(pl.struct(USER_ID, ITEM_CODE, TS).is_first_distinct()).to_series()
    unique = rows.filter(first)
    known, missing = unique, unique.clear()
    if catalog_size is not None:
        unknown = pl.col(ITEM_CODE) >= catalog_size
        missing = unique.filter(unknown)
        if policies.unknown_items is UnknownItems.DROP:
            known = unique.filter(~unknown)
    enough = known.select(pl.len().over(USER_ID) >= policies.min_interactions).to_series()
    kept, short = known.filter(enough), known.filter(~enough)
    short_users = _users_of(short)
    counts = UserPolicyCounts(
        loaded_rows=rows.height,
        loaded_users=rows.get_column(USER_ID).n_unique(),
        kept_rows=kept.height,
        duplicates=rows.height - unique.height,
        duplicate_examples=_example_rows(rows.filter(~first)),
        unknown_rows=missing.height,
        unknown_examples=_example_rows(missing),
        short_users=short_users.height,
        short_rows=short.height,
        short_examples=short_users.head(MAX_EXAMPLES),
    )
    return kept, counts


def _example_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """The first `MAX_EXAMPLES` of `rows` (in file order), as examples name them: row, line?, user_id, item_code."""
    return rows.select(ROW, *_line_of(rows), USER_ID, ITEM_CODE).head(MAX_EXAMPLES)


def _users_of(rows: pl.DataFrame) -> pl.DataFrame:
    """Each user of `rows` once, in order of first row: that row (and its line), user_id, and the user's rows."""
    firsts = [pl.col(ROW).first(), *(pl.col(name).first() for name in _line_of(rows))]
    users = rows.group_by(USER_ID, maintain_order=True).agg(*firsts, pl.len().alias(INTERACTIONS))
    return users.select(ROW, *_line_of(rows), USER_ID, INTERACTIONS)


def _line_of(rows: pl.DataFrame) -> list[str]:
    """[LINE] where the rows have lines, else []."""
    return [LINE] if LINE in rows.columns else []


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
    ids = codes.ids()
    duplicates = PolicyOutcome(
        "duplicate_interactions",
        "drop",
        sum(part.duplicates for part in parts),
        "exact duplicate rows dropped",
        examples(first_examples([part.duplicate_examples for part in parts], ids)),
    )
    items, unknown = resolve_unknown_items(catalog, codes, parts, policies.unknown_items, origin)
    minimum = policies.min_interactions
    short = PolicyOutcome(
        "min_interactions",
        str(minimum),
        sum(part.short_users for part in parts),
        f"users with fewer than {minimum} interactions dropped ({sum(part.short_rows for part in parts)} rows)",
        examples(first_examples([part.short_examples for part in parts], ids)),
    )
    is_used = pl.col(ITEM_CODE).is_in(used.unique().implode())
    used_items, unused_items = items.filter(is_used), items.filter(~is_used)
    unused = PolicyOutcome(
        "items_without_interactions",
        "drop",
        unused_items.height,
        "catalog items without interactions dropped",
        examples(unused_items.select(ITEM_ID).head(MAX_EXAMPLES)),
    )
    outcomes = (duplicates, unknown, short, unused)
    for outcome in outcomes:
        logger.info("policy %s", outcome.text())
    if sum(part.kept_rows for part in parts) == 0:
        raise DataError(
            origin,
            f"no interactions left after the policies ({sum(part.loaded_rows for part in parts)} loaded)",
            "lower --min-interactions, or check that the catalog matches the interactions",
        )
    return used_items, outcomes


def first_examples(part_examples: Sequence[pl.DataFrame], ids: pl.DataFrame) -> pl.DataFrame:
    """The first `MAX_EXAMPLES` of the parts' examples in file order (whatever the number of parts), item codes
    replaced by item ids.

    Args:
        part_examples: each part's examples (`UserPolicyCounts`), each with `row`; the same columns in all.
        ids: item_code, item_id of every item (`ItemCodes.ids`).
    """
    first = pl.concat(part_examples).sort(ROW).head(MAX_EXAMPLES)
    if ITEM_CODE not in first.columns:
        return first
    first = first.join(ids, on=ITEM_CODE, how="left", maintain_order="left")
    return first.select(ITEM_ID if name == ITEM_CODE else name for name in first.columns if name != ITEM_ID)


def examples(frame: pl.DataFrame) -> tuple[Example, ...]:
    """Example frames as `PolicyOutcome` examples: `row` becomes `interaction` (1-based) where there is no `line`.

    Args:
        frame: rows with some of row, line, user_id, item_id, interactions.
    """
    if ROW in frame.columns:
        position = (pl.col(ROW) + 1).alias(INTERACTION)
        frame = frame.drop(ROW) if LINE in frame.columns else frame.with_columns(position).drop(ROW)
        frame = frame.select(
            name for name in (LINE, INTERACTION, USER_ID, ITEM_ID, INTERACTIONS) if name in frame.columns
        )
    return tuple(frame.iter_rows(named=True))


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
    detail = f"interactions with items absent from the catalog ({others.height} items), {_VERB[policy]}"
    first = first_examples([part.unknown_examples for part in parts], others.select(ITEM_CODE, ITEM_ID))
    outcome = PolicyOutcome("unknown_items", policy.value, unknown_rows, detail, examples(first))
    if unknown_rows == 0 or policy is UnknownItems.KEEP:
        items = pl.concat([catalog, others], how="diagonal_relaxed")
        return _fill_text(items), outcome
    if policy is UnknownItems.DROP:
        return catalog, outcome
    row = first.row(0, named=True)
    raise DataError(
        origin,
        f"item {row[ITEM_ID]!r} of user {row[USER_ID]!r} (interaction {row[ROW] + 1}) is not in the "
        f"item catalog; {unknown_rows} interactions name {others.height} unknown items",
        "add the items to the catalog, or pass --unknown-items drop (or keep)",
        line=row.get(LINE),
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
    rows = codes.encode(interaction_rows(raw).with_row_index(ROW))
    catalog_size = None if raw.items is None else codes.num_catalog
    kept, counts = apply_user_policies(rows, catalog_size, policies)
    items, outcomes = apply_item_policies(raw.items, codes, kept.get_column(ITEM_CODE), [counts], policies, origin)
    ids = codes.ids()
    item_ids = pl.col(ITEM_CODE).replace_strict(ids[ITEM_CODE], ids[ITEM_ID], return_dtype=pl.String).alias(ITEM_ID)
    columns = [name for name in kept.columns if name not in (ROW, LINE)]
    interactions = kept.select(item_ids if name == ITEM_CODE else pl.col(name) for name in columns)
    return CleanDataset(interactions=interactions, items=items.drop(ITEM_CODE), outcomes=outcomes)


def _fill_text(items: pl.DataFrame) -> pl.DataFrame:
    """Empty strings instead of nulls in the catalog's text columns."""
    return items.with_columns(pl.col(pl.String).fill_null(""))
