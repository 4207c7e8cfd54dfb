"""benchmarks.runtime_items: the data without the withheld items, and what is kept of them to ask the server."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from benchmarks.runtime_items import ITEMS, SEQUENCES, WITHHELD, withhold_items


def _raw(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / SEQUENCES).write_text("u1 a b c d\nu2 b c e\nu3 a e\nu4 c d b\n")
    pl.DataFrame({"item_id": list("abcde"), "title": ["A", "B", "C", "D", "E"]}).write_csv(raw / ITEMS)
    return raw


def test_withheld_items_leave_the_data_and_their_users_keep_the_history_before_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    withheld = withhold_items(_raw(tmp_path), out, count=2, seed=0)
    chosen = {item["item_id"] for item in withheld.items}
    assert len(chosen) == 2 and chosen <= {"b", "d", "e"}  # drawn among the users' last items
    sequences = [line.split() for line in (out / SEQUENCES).read_text().splitlines()]
    assert all(not chosen & set(row[1:]) for row in sequences)
    assert not chosen & set(pl.read_csv(out / ITEMS)["item_id"].to_list())
    full = {"u1": "a b c d", "u2": "b c e", "u3": "a e", "u4": "c d b"}
    expected = [{"user_id": user, "item_id": items.split()[-1], "history": items.split()[:-1]}
                for user, items in full.items() if items.split()[-1] in chosen]  # fmt: skip
    assert withheld.targets == expected
    titles = {item["item_id"]: item["title"] for item in withheld.items}
    assert titles == {item: item.upper() for item in chosen}


def test_withholding_again_with_the_same_arguments_reads_the_record_back(tmp_path: Path) -> None:
    raw, out = _raw(tmp_path), tmp_path / "out"
    first = withhold_items(raw, out, count=2, seed=0)
    record = json.loads((out / WITHHELD).read_text())
    record["targets"] = []  # a mark: read back, not drawn again
    (out / WITHHELD).write_text(json.dumps(record))
    assert withhold_items(raw, out, count=2, seed=0).targets == []
    assert withhold_items(raw, out, count=1, seed=0).items != first.items  # other arguments: drawn anew
