"""write_p5: a prepared directory in the P5 text form, read back by the amazon-p5 loader to the same data."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from features.export import write_p5
from features.loaders import open_amazon_p5
from features.prepare import prepare
from features.raw import RawDataset
from features.settings import PrepareSettings
from features.sources import open_source
from recsys.data import schema
from recsys.errors import DataError


def _interactions(prepared: Path) -> pl.DataFrame:
    """Every part's (user_idx, item_idx) rows, users in order, each user's rows in time order."""
    files = sorted(prepared.glob(f"{schema.INTERACTIONS_DIR}/{schema.PART_FILES}")) or [
        prepared / schema.INTERACTIONS_FILE
    ]
    rows = pl.concat(pl.read_parquet(path, columns=[schema.USER_IDX, schema.ITEM_IDX]) for path in files)
    return rows.sort(schema.USER_IDX, maintain_order=True)


def test_p5_form_of_a_parted_prepare_reads_back_to_the_same_sequences(tmp_path: Path) -> None:
    synthetic = open_source("synthetic", None, num_users=300, num_items=200)
    before = prepare(
        synthetic, tmp_path / "prepared", PrepareSettings(partitions=3)
    )  # three parts: the writer goes part by part
    export = write_p5(tmp_path / "prepared", tmp_path / "p5" / "amazon-synthetic")
    assert (export.users, export.interactions) == (before.num_users, before.num_interactions)
    assert export.sequence_bytes == (tmp_path / "p5" / "amazon-synthetic" / "user_sequence.txt").stat().st_size
    after = prepare(open_amazon_p5(export.out_dir), tmp_path / "prepared-p5")
    assert (after.num_users, after.num_items, after.num_interactions) == (
        before.num_users,
        before.num_items,
        before.num_interactions,
    )
    # dense ids follow sorted ids on both sides, so the same sequences are the same (user_idx, item_idx) rows
    assert _interactions(tmp_path / "prepared-p5").equals(_interactions(tmp_path / "prepared"))
    titles = [
        pl.read_parquet(tmp_path / name / schema.ITEMS_FILE)[schema.TITLE] for name in ("prepared", "prepared-p5")
    ]
    assert titles[0].equals(titles[1])


def test_a_title_with_a_line_break_is_written_on_one_line(tmp_path: Path) -> None:
    rows = {"user_id": ["u"] * 3, "item_id": ["a", "b", "c"], "ts": [1, 2, 3]}
    items = pl.DataFrame({"item_id": ["a", "b", "c"], "title": ["Soap,\nlarge", "Brush", ""]})
    prepare(RawDataset(pl.DataFrame(rows), items, "example"), tmp_path / "prepared")
    write_p5(tmp_path / "prepared", tmp_path / "p5")
    read_back = open_amazon_p5(tmp_path / "p5").items
    assert read_back is not None and read_back["title"].to_list() == ["Soap, large", "Brush", ""]


def test_an_id_with_whitespace_cannot_be_written(tmp_path: Path) -> None:
    rows = {"user_id": ["jane doe"] * 3, "item_id": ["a", "b", "c"], "ts": [1, 2, 3]}
    prepare(RawDataset(pl.DataFrame(rows), None, "example"), tmp_path / "prepared")
    with pytest.raises(DataError, match=r"user_id\(s\) hold whitespace, e.g. 'jane doe'"):
        write_p5(tmp_path / "prepared", tmp_path / "p5")
    assert not (tmp_path / "p5").exists()


def test_a_directory_that_is_not_prepared_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="prepared data file not found"):
        write_p5(tmp_path, tmp_path / "p5")
