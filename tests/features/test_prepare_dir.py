"""prepare(): id maps, ordering, leave-one-out splits, cold-start marks, atomic and idempotent writes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import features.prepare as prepare_module
from features.loaders import load_amazon_p5, open_amazon_p5
from features.prepare import build_prepared, num_parts_for, prepare
from features.raw import RawDataset, as_stream
from features.settings import PrepareSettings
from recsys.data import schema
from recsys.errors import ConfigError, DataError

PREPARED_FILES = sorted([schema.INTERACTIONS_FILE, schema.ITEMS_FILE, schema.USERS_FILE, schema.META_FILE])


def _raw(rows: list[tuple[str, str, int]]) -> RawDataset:
    frame = pl.DataFrame(rows, schema={"user_id": pl.String, "item_id": pl.String, "ts": pl.Int64}, orient="row")
    return RawDataset(frame, None, "test")


def test_prepared_layout_and_types(p5_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    summary = prepare(load_amazon_p5(p5_dir), out)
    assert sorted(p.name for p in out.iterdir()) == PREPARED_FILES
    interactions = pl.read_parquet(out / schema.INTERACTIONS_FILE)
    items = pl.read_parquet(out / schema.ITEMS_FILE)
    users = pl.read_parquet(out / schema.USERS_FILE)
    assert interactions.columns[:3] == ["user_idx", "item_idx", "ts"]  # no split column: recsys.data.splits
    assert interactions.schema["user_idx"] == pl.Int32 and interactions.schema["item_idx"] == pl.Int32
    assert items.columns[:4] == ["item_idx", "item_id", "title", "is_cold"]
    # ids: 1-based, dense, sorted by the raw id; 0 stays free for padding
    assert items["item_id"].to_list() == ["a", "b", "c", "d", "e", "f"]
    assert items["item_idx"].to_list() == [1, 2, 3, 4, 5, 6]
    assert users.rows() == [(1, "u1"), (2, "u2"), (3, "u3")]
    assert (summary.num_users, summary.num_items, summary.num_interactions) == (3, 6, 11)
    meta = json.loads((out / schema.META_FILE).read_text())
    assert meta["counts"]["interactions"] == 11
    assert [p["name"] for p in meta["policies"]] == [
        "duplicate_interactions",
        "unknown_items",
        "min_interactions",
        "items_without_interactions",
    ]
    assert meta["inputs"][0].endswith("user_sequence.txt")


def test_sort_is_stable_for_equal_timestamps() -> None:
    rows = [("u", "c", 5), ("u", "a", 1), ("u", "b", 5), ("u", "d", 5)]
    prepared = build_prepared(_raw(rows))
    item_ids = dict(prepared.items.select("item_idx", "item_id").iter_rows())
    ordered = [item_ids[i] for i in prepared.interactions["item_idx"]]
    assert ordered == ["a", "c", "b", "d"]  # ts 1 first, then ts 5 in file order


histories = st.dictionaries(
    keys=st.text("uvw", min_size=1, max_size=3),
    values=st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 5)), min_size=3, max_size=8, unique=True),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(histories)
def test_each_users_interactions_are_in_time_order(data: dict[str, list[tuple[str, int]]]) -> None:
    rows = [(user, item, ts) for user, events in data.items() for item, ts in events]
    prepared = build_prepared(_raw(rows))
    interactions = prepared.interactions
    for _, group in interactions.group_by("user_idx"):
        assert group["ts"].is_sorted()
    assert interactions["user_idx"].is_sorted()
    users = len(data)
    counts = prepared.meta["counts"]
    assert (counts["valid"], counts["test"], counts["train"]) == (users, users, len(rows) - 2 * users)


def test_cold_start_marking_is_seeded() -> None:
    rows = [(f"u{u}", f"i{(u * 7 + k) % 40:02d}", k) for u in range(30) for k in range(5)]

    def cold(seed: int, fraction: float = 0.1) -> list[str]:
        items = build_prepared(_raw(rows), PrepareSettings(cold_start_fraction=fraction, seed=seed)).items
        return items.filter("is_cold")["item_id"].to_list()

    assert len(cold(0)) == round(0.1 * 40)
    assert cold(0) == cold(0)
    assert cold(0) != cold(1)
    assert cold(0, fraction=0.0) == []


def test_cold_start_fraction_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"cold_start_fraction: Input should be less than 1"):
        PrepareSettings.checked(cold_start_fraction=1.0)


def test_rerun_is_byte_identical(p5_dir: Path, tmp_path: Path) -> None:
    raw = load_amazon_p5(p5_dir)
    first, second = tmp_path / "one", tmp_path / "two"
    prepare(raw, first, PrepareSettings(cold_start_fraction=0.3, seed=3))
    snapshot = {name: (first / name).read_bytes() for name in PREPARED_FILES}
    prepare(load_amazon_p5(p5_dir), first, PrepareSettings(cold_start_fraction=0.3, seed=3))  # replaces in place
    prepare(raw, second, PrepareSettings(cold_start_fraction=0.3, seed=3))
    for name in PREPARED_FILES:
        assert (first / name).read_bytes() == snapshot[name], name
        assert (second / name).read_bytes() == snapshot[name], name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amazon-toys", "one", "two"]  # no temp dirs left


def test_failure_leaves_nothing_behind(p5_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_write(prepared: prepare_module.PreparedData, directory: Path, *_: object) -> None:
        prepared.users.write_parquet(directory / schema.USERS_FILE)
        raise OSError("disk full")

    monkeypatch.setattr(prepare_module, "write_tables", half_write)
    out = tmp_path / "prepared"
    with pytest.raises(DataError, match=f"{out}: cannot write the prepared directory: disk full"):
        prepare(load_amazon_p5(p5_dir), out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amazon-toys"]


def test_failure_keeps_the_previous_output(p5_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "prepared"
    prepare(load_amazon_p5(p5_dir), out)
    before = {name: (out / name).read_bytes() for name in PREPARED_FILES}

    def broken(prepared: prepare_module.PreparedData, directory: Path, *_: object) -> None:
        raise RuntimeError("step failed")

    monkeypatch.setattr(prepare_module, "write_tables", broken)
    with pytest.raises(RuntimeError):
        prepare(load_amazon_p5(p5_dir), out, PrepareSettings(cold_start_fraction=0.5))
    assert {name: (out / name).read_bytes() for name in PREPARED_FILES} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amazon-toys", "prepared"]


def test_refuses_to_replace_an_unrelated_directory(p5_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    with pytest.raises(DataError, match="is not an output of this tool"):
        prepare(load_amazon_p5(p5_dir), out)
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_an_output_under_a_file_names_that_file(p5_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("a file, not a directory")
    out = tmp_path / "notes.txt" / "sub" / "prepared"
    with pytest.raises(DataError) as info:
        prepare(load_amazon_p5(p5_dir), out)
    assert str(info.value).startswith(f"{out}: cannot write the prepared directory: {tmp_path / 'notes.txt'} is a file")
    assert "Fix: choose an output whose parent is a writable directory" in str(info.value)


def test_an_output_under_a_read_only_directory_is_a_data_error(p5_dir: Path, tmp_path: Path) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir(mode=0o555)
    if os.access(parent, os.W_OK):
        pytest.skip("this user (root) may write to a read-only directory")
    with pytest.raises(DataError, match=f"{parent / 'prepared'}: cannot write the prepared directory: permission"):
        prepare(load_amazon_p5(p5_dir), parent / "prepared")


# --- inputs of any size: read in batches, written in parts ---------------------------------------------


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _skewed_sequences(write: Callable[..., Path]) -> Path:
    """30 users, duplicates, short users, an item outside the catalog and catalog items nobody names."""
    lines = [f"user{u} " + " ".join(f"i{(u * 7 + k) % 23}" for k in range(3 + u % 5)) for u in range(30)]
    lines[4] += " i1 i1 x9"  # a duplicate position is not an exact duplicate: "i1" twice at different ts
    lines[7] = "user7 i2 i3"  # too short
    write("big/items.csv", "item_id,title\n" + "".join(f"i{i},Item {i}\n" for i in range(25)))
    return write("big/user_sequence.txt", "\n".join(lines) + "\n")


def test_batch_size_changes_no_byte(
    write: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _skewed_sequences(write)
    prepare(open_amazon_p5(path), tmp_path / "whole", PrepareSettings(cold_start_fraction=0.2))
    monkeypatch.setattr(prepare_module, "MAX_BATCH_BYTES", 16)  # tiny batches (a tiny budget trips the memory check)
    prepare(open_amazon_p5(path), tmp_path / "batches", PrepareSettings(cold_start_fraction=0.2))
    assert _files(tmp_path / "whole") == _files(tmp_path / "batches")
    assert _files(tmp_path / "whole") == _files_of_eager(path, tmp_path / "eager")


def _files_of_eager(path: Path, out: Path) -> dict[str, bytes]:
    prepare(load_amazon_p5(path), out, PrepareSettings(cold_start_fraction=0.2))
    return _files(out)


@pytest.mark.parametrize("unknown_items", ["drop", "keep"])
def test_parts_hold_the_same_content(write: Callable[..., Path], tmp_path: Path, unknown_items: str) -> None:
    path = _skewed_sequences(write)
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    one = prepare(open_amazon_p5(path), whole, PrepareSettings(unknown_items=unknown_items, cold_start_fraction=0.2))
    four = prepare(
        open_amazon_p5(path),
        parted,
        PrepareSettings(unknown_items=unknown_items, cold_start_fraction=0.2, partitions=4),
    )
    assert one == replace(four, out_dir=whole)
    parts = sorted((parted / schema.INTERACTIONS_DIR).iterdir())
    assert [p.name for p in parts] == [schema.part_file_name(i) for i in range(4)]
    assert not (parted / schema.INTERACTIONS_FILE).exists()
    tables = [pl.read_parquet(p) for p in parts]
    users_per_part = [set(table["user_idx"]) for table in tables]
    assert sum(map(len, users_per_part)) == len(set().union(*users_per_part)) == one.num_users  # a user in one part
    assert all(table["user_idx"].is_sorted() for table in tables)
    merged = pl.concat(tables).sort("user_idx", maintain_order=True)
    assert merged.equals(pl.read_parquet(whole / schema.INTERACTIONS_FILE))
    for name in (schema.ITEMS_FILE, schema.USERS_FILE, schema.META_FILE):
        assert (parted / name).read_bytes() == (whole / name).read_bytes(), name


def test_parted_rerun_is_byte_identical(
    write: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _skewed_sequences(write)
    out = tmp_path / "parted"
    prepare(open_amazon_p5(path), out, PrepareSettings(partitions=3))
    first = _files(out)
    monkeypatch.setattr(prepare_module, "MAX_BATCH_BYTES", 1)
    prepare(open_amazon_p5(path), out, PrepareSettings(partitions=3))  # replaces in place, other batches
    assert _files(out) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "parted"]  # no temp or scratch directory left


def test_the_number_of_parts_follows_the_input_size(p5_dir: Path) -> None:
    stream = open_amazon_p5(p5_dir)
    assert num_parts_for(stream) == 1
    assert num_parts_for(replace(stream, size_bytes=3 * prepare_module.PART_INPUT_BYTES + 1)) == 4
    assert num_parts_for(as_stream(load_amazon_p5(p5_dir))) == 1  # in memory: one part


@pytest.mark.parametrize(("setting", "value"), [("memory_budget_gb", 0.0), ("partitions", 0)])
def test_scale_settings_are_checked(setting: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{setting}: Input should be greater than 0. Fix: "):
        PrepareSettings.checked(**{setting: value})
