"""`PreparedParts`: a partitioned prepared directory read a shuffle buffer of parts at a time, for training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.jagged import Jagged
from recsys.data.prepared import PreparedParts, load_prepared


@pytest.fixture(scope="module")
def parted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "prepared"
    prepare(
        load_source("synthetic", None, num_users=240, num_items=120),
        out,
        PrepareSettings(cold_start_fraction=0.1, partitions=6),
    )
    return out


def _rows_by_user(items: Jagged) -> list[tuple[int, ...]]:
    return sorted(tuple(items.row(b).tolist()) for b in range(len(items)))


def test_an_epoch_covers_every_users_training_rows_once(parted_dir: Path) -> None:
    whole = load_prepared(parted_dir)
    parts = PreparedParts.open(parted_dir, buffer_parts=2)
    assert len(parts.files) == 6 and parts.num_users == whole.num_users and parts.num_items == whole.num_items
    chunks = list(parts.training_epoch(torch.Generator().manual_seed(0)))
    assert len(chunks) == 3  # 6 parts, 2 per shuffle buffer
    streamed = [row for chunk in chunks for row in _rows_by_user(chunk.items)]
    assert sorted(streamed) == _rows_by_user(whole.training_rows().items)
    assert torch.equal(parts.item_counts(), whole.item_counts())
    assert torch.equal(parts.training_excluded(), whole.training_excluded())


def test_the_part_order_is_drawn_from_the_generator(parted_dir: Path) -> None:
    parts = PreparedParts.open(parted_dir)

    def first_rows(generator: torch.Generator) -> list[list[int]]:
        return [chunk.items.row(0).tolist() for chunk in parts.training_epoch(generator)]

    same_seed = first_rows(torch.Generator().manual_seed(3)), first_rows(torch.Generator().manual_seed(3))
    assert same_seed[0] == same_seed[1]
    generator = torch.Generator().manual_seed(3)
    epochs = first_rows(generator), first_rows(generator)  # the generator moves on: the next epoch's order differs
    assert epochs[0] == same_seed[0] and epochs[1] != epochs[0]


def test_selected_users_are_read_part_by_part(parted_dir: Path) -> None:
    whole = load_prepared(parted_dir)
    rows = torch.tensor([0, 7, 8, 100, 239])
    picked = PreparedParts.open(parted_dir).select_users(rows).eval_split("valid")
    expected = whole.select_users(rows).eval_split("valid")
    assert torch.equal(picked.targets, expected.targets) and torch.equal(picked.user_idx, rows + 1)
    assert torch.equal(picked.histories.values, expected.histories.values)
    assert torch.equal(picked.histories.offsets, expected.histories.offsets)
