from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
import torch

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.prepared import load_prepared
from recsys.errors import DataError


def test_leave_one_out_splits_follow_the_sequences(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    inter = pl.read_parquet(tiny_data_dir / "interactions.parquet")
    first_user = inter.filter(pl.col("user_idx") == 1)
    items = first_user["item_idx"].to_list()
    assert data.sequences.row(0).tolist() == items
    valid, test = data.eval_split("valid"), data.eval_split("test")
    assert valid.targets[0].item() == items[-2] and test.targets[0].item() == items[-1]  # recsys.data.splits
    assert test.histories.row(0).tolist() == items[:-1]
    rows = data.training_rows()
    assert rows.items.row(0).tolist() == data.training_sequences().row(0).tolist() == items[:-2]
    assert rows.timestamps.row(0).tolist() == first_user["ts"].to_list()[:-2]
    assert test.timestamps is not None and test.timestamps.row(0).tolist() == first_user["ts"].to_list()[:-1]
    assert test.request_times is not None and test.request_times[0].item() == first_user["ts"].to_list()[-1]


def test_cold_items_leave_training_and_inputs_but_stay_targets(tmp_path: Path) -> None:
    out = tmp_path / "cold"
    prepare(
        load_source("synthetic", None, num_users=300, num_items=150),
        out,
        PrepareSettings(cold_start_fraction=0.2, seed=1),
    )
    data = load_prepared(out)
    cold = data.cold_mask
    assert 0.15 < cold.float().sum().item() / data.num_items < 0.25
    assert not cold[data.training_sequences().values].any()
    # the times stay aligned with the items once the cold ones are dropped
    inter = pl.read_parquet(out / "interactions.parquet")
    is_cold = pl.Series(cold.tolist())
    for user in (1, 2, 3):
        rows = inter.filter(pl.col("user_idx") == user).head(-2)
        warm = rows.filter(~is_cold.gather(rows["item_idx"].cast(pl.Int64)))
        assert data.training_sequences().row(user - 1).tolist() == warm["item_idx"].to_list()
        assert data.training_rows().timestamps.row(user - 1).tolist() == warm["ts"].to_list()
        assert data.training_rows().labels["value"].row(user - 1).tolist() == warm["value"].to_list()
    test = data.eval_split("test")
    assert not cold[test.histories.values].any()
    assert cold[test.targets].any(), "some test targets should be cold items"
    assert data.item_counts()[cold].sum() == 0


def test_missing_file_names_the_file_and_the_fix(tiny_data_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_data_dir, broken)
    (broken / "items.parquet").unlink()
    with pytest.raises(DataError, match=r"items.parquet: prepared data file not found. Fix: prepare it"):
        load_prepared(broken)


def test_titles_fall_back_to_item_ids(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    titles = data.titles(torch.tensor([1, 2]))
    assert all(isinstance(t, str) and t for t in titles)


def test_task_labels_travel_with_the_interactions(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    inter = pl.read_parquet(tiny_data_dir / "interactions.parquet")
    first_user = inter.filter(pl.col("user_idx") == 1)
    assert data.tasks == ("event:purchase", "value")
    purchases = (first_user["event"] == "purchase").cast(pl.Float32).to_list()
    test = data.eval_split("test")
    assert test.target_labels["event:purchase"][0].item() == purchases[-1]
    assert test.target_labels["value"][0].item() == first_user["value"][-1]
    assert data.training_rows().labels["event:purchase"].row(0).tolist() == purchases[:-2]
    domain = data.for_domain(data.domains[0])
    assert len(domain.labels["value"].values) == len(domain.sequences.values)  # filtered with the items


def test_interactions_in_parts_read_as_one_file(tmp_path: Path) -> None:
    raw = load_source("synthetic", None, num_users=60, num_items=40)
    prepare(raw, tmp_path / "whole", PrepareSettings(cold_start_fraction=0.1))
    prepare(raw, tmp_path / "parted", PrepareSettings(cold_start_fraction=0.1, partitions=5))
    assert not (tmp_path / "parted" / "interactions.parquet").exists()
    whole, parted = load_prepared(tmp_path / "whole"), load_prepared(tmp_path / "parted")
    assert torch.equal(parted.sequences.values, whole.sequences.values)
    assert torch.equal(parted.sequences.lengths(), whole.sequences.lengths())
    assert torch.equal(parted.timestamps.values, whole.timestamps.values)
    assert parted.labels.keys() == whole.labels.keys()
    assert all(torch.equal(parted.labels[task].values, whole.labels[task].values) for task in whole.labels)
    assert parted.users.equals(whole.users) and parted.items.equals(whole.items)


def test_missing_interactions_name_the_file(tiny_data_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_data_dir, broken)
    (broken / "interactions.parquet").unlink()
    with pytest.raises(DataError, match=r"interactions.parquet: prepared data file not found \(nor its parts"):
        load_prepared(broken)
