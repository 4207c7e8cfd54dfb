from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from recsys.errors import DataError
from recsys.semantic_ids import deduplicate, read_semantic_ids, semantic_id_stats, write_semantic_ids
from recsys.semantic_ids.codes import stats_path

CODES = np.array(
    [
        [0, 1, 2],
        [0, 1, 2],
        [0, 1, 3],
        [1, 0, 0],
        [0, 1, 2],
        [1, 0, 0],
    ]
)


def test_deduplicate_numbers_items_sharing_a_tuple_in_row_order() -> None:
    out = deduplicate(CODES)
    assert out[:, 3].tolist() == [0, 1, 0, 0, 2, 1]
    np.testing.assert_array_equal(out[:, :3], CODES)
    assert len(np.unique(out, axis=0)) == len(out)


def test_deduplicate_makes_random_codes_unique() -> None:
    codes = np.random.default_rng(0).integers(3, size=(500, 2))
    out = deduplicate(codes)
    assert len(np.unique(out, axis=0)) == 500
    assert out[:, 2].max() + 1 == np.unique(codes, axis=0, return_counts=True)[1].max()


def test_stats_on_a_hand_built_example() -> None:
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    x_hat = x + 0.5
    stats = semantic_id_stats(CODES, codebook_size=4, x=x, x_hat=x_hat)
    assert stats.num_items == 6 and stats.levels == 3 and stats.codebook_size == 4
    assert stats.utilisation == (0.5, 0.5, 0.75)  # level 3 uses codes 0, 2, 3
    assert stats.unique_prefixes == (2, 2, 3)
    p = np.array([4, 2]) / 6
    assert stats.perplexity[0] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert stats.collision_rate == pytest.approx(5 / 6)  # all but the single [0, 1, 3]
    assert stats.max_collision == 3
    assert stats.recon_mse == pytest.approx(0.25)
    variance = ((x - x.mean(0)) ** 2).sum()
    assert stats.recon_relative == pytest.approx(12 * 0.25 / variance)
    alone = semantic_id_stats(np.arange(8).reshape(4, 2), codebook_size=8)
    assert alone.collision_rate == 0.0 and alone.max_collision == 1 and alone.recon_mse is None


def test_parquet_round_trip(tmp_path: Path) -> None:
    codes = deduplicate(CODES)
    stats = semantic_id_stats(CODES, codebook_size=4)
    item_idx = np.array([3, 1, 2, 6, 5, 4])  # any order: rows are matched by item_idx
    item_id = [f"i{i}" for i in item_idx]
    path = tmp_path / "sid" / "semantic_ids.parquet"
    write_semantic_ids(path, item_idx, item_id, codes, stats, meta={"method": "rqkmeans"})
    assert sorted(p.name for p in path.parent.iterdir()) == ["semantic_ids.parquet", "semantic_ids.stats.json"]

    table = pl.read_parquet(path)
    assert table.schema == {"item_idx": pl.Int32, "item_id": pl.String, "codes": pl.List(pl.Int16)}
    assert table["item_idx"].to_list() == [1, 2, 3, 4, 5, 6]
    assert json.loads(stats_path(path).read_text())["codebook_sizes"] == [4, 4, 4, 3]

    ids, read_stats = read_semantic_ids(path)
    assert read_stats == stats
    assert ids.codebook_sizes == (4, 4, 4, 3) and ids.meta == {"method": "rqkmeans"}
    assert ids.num_items == 6 and ids.num_levels == 4
    assert ids.codes.dtype.is_floating_point is False and ids.codes.shape == (7, 4)
    assert ids.codes[0].tolist() == [-1, -1, -1, -1]  # padding row
    for row, idx in enumerate(item_idx):
        assert ids.codes[idx].tolist() == codes[row].tolist()


def test_large_collision_codes_are_stored_as_int32(tmp_path: Path) -> None:
    codes = np.array([[0, 0], [0, 40_000]])
    stats = semantic_id_stats(codes[:, :1], codebook_size=2)
    write_semantic_ids(tmp_path / "s.parquet", [1, 2], ["a", "b"], codes, stats)
    assert pl.read_parquet(tmp_path / "s.parquet").schema["codes"] == pl.List(pl.Int32)
    ids, _ = read_semantic_ids(tmp_path / "s.parquet")
    assert ids.codes[2].tolist() == [0, 40_000]


def test_bad_writes_name_the_problem(tmp_path: Path) -> None:
    stats = semantic_id_stats(CODES, codebook_size=4)
    path = tmp_path / "semantic_ids.parquet"
    with pytest.raises(DataError, match="deduplicate"):
        write_semantic_ids(path, np.arange(1, 7), list("abcdef"), np.c_[CODES, np.zeros(6, int)], stats)
    with pytest.raises(DataError, match=r"1\.\.V"):
        write_semantic_ids(path, np.arange(2, 8), list("abcdef"), deduplicate(CODES), stats)
    assert not path.exists() and not stats_path(path).exists()
    with pytest.raises(DataError, match="not found"):
        read_semantic_ids(path)
