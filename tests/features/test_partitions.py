"""The item dictionary of the first prepare pass: codes follow the catalog, then first appearance, across batches."""

from __future__ import annotations

import numpy as np
import polars as pl

from features.partitions import ITEM_CODE, ItemCodes
from recsys.data.schema import DOMAIN, ITEM_ID, TITLE


def _reference_codes(catalog: list[str], batches: list[list[str]]) -> list[list[int]]:
    """The rule in plain Python: catalog ids in catalog order, then every other id at its first appearance."""
    codes: dict[str, int] = {item: code for code, item in enumerate(catalog)}
    return [[codes.setdefault(item, len(codes)) for item in batch] for batch in batches]


def test_codes_follow_the_catalog_then_first_appearance_across_batches() -> None:
    rng = np.random.default_rng(7)
    catalog = [f"c{i}" for i in rng.permutation(50)]
    pool = catalog + [f"x{i}" for i in range(80)]  # 80 ids outside the catalog
    batches = [[pool[i] for i in rng.integers(0, len(pool), size)] for size in (40, 1, 300, 0, 120)]
    codes = ItemCodes(pl.DataFrame({ITEM_ID: catalog, TITLE: [""] * len(catalog)}))

    coded = [
        codes.encode(
            pl.DataFrame({ITEM_ID: batch, "ts": range(len(batch))}, schema={ITEM_ID: pl.String, "ts": pl.Int64})
        )
        for batch in batches
    ]

    assert [frame.get_column(ITEM_CODE).to_list() for frame in coded] == _reference_codes(catalog, batches)
    assert all(frame.columns == [ITEM_CODE, "ts"] for frame in coded)  # item_id replaced in place
    assert codes.num_catalog == 50
    ids = codes.ids()
    assert ids.get_column(ITEM_CODE).to_list() == list(range(len(codes)))
    assert ids.get_column(ITEM_ID).to_list()[:50] == catalog
    assert set(ids.get_column(ITEM_ID).to_list()[50:]) == {item for batch in batches for item in batch} - set(catalog)


def test_items_outside_the_catalog_keep_the_domain_of_their_first_row() -> None:
    codes = ItemCodes(None)
    codes.encode(pl.DataFrame({ITEM_ID: ["a", "b", "a"], DOMAIN: ["books", "toys", "games"]}))
    codes.encode(pl.DataFrame({ITEM_ID: ["b", "c"], DOMAIN: ["games", "books"]}))

    assert codes.others().rows() == [(0, "a", "", "books"), (1, "b", "", "toys"), (2, "c", "", "books")]
