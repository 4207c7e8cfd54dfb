"""Loaders on small generated files: canonical schema, values, gzip, optional catalogs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from features.loaders import load_amazon_p5, load_amazon_raw, load_movielens, open_amazon_p5
from recsys.data.schema import interaction_columns
from recsys.errors import DataError

WriteFile = Callable[..., Path]


def _assert_canonical(frame: pl.DataFrame) -> None:
    for name, dtype in interaction_columns().items():
        assert frame.schema[name] == dtype, name


def test_p5_reads_sequences_positions_and_catalog(p5_dir: Path) -> None:
    raw = load_amazon_p5(p5_dir)
    _assert_canonical(raw.interactions)
    assert raw.source == "amazon-p5"
    assert raw.interactions.height == 11
    assert raw.interactions.filter(pl.col("user_id") == "u2").select("item_id", "ts").rows() == [
        ("b", 0),
        ("c", 1),
        ("e", 2),
    ]
    assert set(raw.interactions["domain"]) == {"toys"}
    assert raw.items is not None
    assert dict(raw.items.select("item_id", "title").iter_rows())["b"] == "Bravo, the sequel"
    assert [p.name for p in raw.files] == ["user_sequence.txt", "items.csv"]


def test_p5_accepts_the_file_gzip_and_no_catalog(write: WriteFile, p5_dir: Path) -> None:
    path = write("seq/user_sequence.txt.gz", (p5_dir / "user_sequence.txt").read_text(), gz=True)
    raw = load_amazon_p5(path, domain="games")
    assert raw.items is None
    assert raw.interactions.height == 11
    assert set(raw.interactions["domain"]) == {"games"}


def test_p5_catalog_gzip_with_quotes_and_an_empty_title(write: WriteFile, tmp_path: Path) -> None:
    write("d/user_sequence.txt", "u1 a b c\n")
    write("d/items.csv.gz", 'item_id,title\na,"two, ""quoted"" words"\nb,\nc,C\n', gz=True)
    raw = load_amazon_p5(tmp_path / "d")
    assert raw.items is not None
    assert raw.items["title"].to_list() == ['two, "quoted" words', "", "C"]


REVIEWS = "\n".join(
    [
        '{"reviewerID": "u1", "asin": "a", "unixReviewTime": 30, "overall": 5.0, "reviewText": "nice"}',
        '{"reviewerID": "u1", "asin": "b", "unixReviewTime": 10, "overall": 3.0, "helpful": [0, 1]}',
        '{"reviewerID": "u2", "asin": "a", "unixReviewTime": 20, "overall": 4}',
    ]
)
# 2014 meta files are Python dict literals (single quotes), not JSON.
META = "\n".join(
    [
        "{'asin': 'a', 'title': 'Alpha', 'categories': [['Beauty', 'Skin Care']], 'brand': 'Acme'}",
        "{'asin': 'b', 'categories': [['Beauty']], 'description': 'no title here'}",
    ]
)


def test_amazon_raw_reviews_and_python_literal_meta(write: WriteFile, tmp_path: Path) -> None:
    write("raw/reviews_Beauty_5.json.gz", REVIEWS, gz=True)
    write("raw/meta_Beauty.json.gz", META, gz=True)
    raw = load_amazon_raw(tmp_path / "raw")
    _assert_canonical(raw.interactions)
    assert raw.interactions.select("user_id", "item_id", "ts", "event", "value", "domain").rows() == [
        ("u1", "a", 30, "review", 5.0, "beauty"),
        ("u1", "b", 10, "review", 3.0, "beauty"),
        ("u2", "a", 20, "review", 4.0, "beauty"),
    ]
    assert raw.items is not None
    items = {row["item_id"]: row for row in raw.items.iter_rows(named=True)}
    assert items["a"]["category"] == "Beauty > Skin Care"
    assert items["a"]["brand"] == "Acme"
    assert items["b"]["title"] == ""
    assert items["b"]["description"] == "no title here"


def test_amazon_raw_without_meta(write: WriteFile) -> None:
    path = write("reviews_Toys.json", REVIEWS)
    raw = load_amazon_raw(path)
    assert raw.items is None
    assert set(raw.interactions["domain"]) == {"toys"}


def test_movielens_dat_with_latin1_movies(write: WriteFile, tmp_path: Path) -> None:
    write("ml/ratings.dat", "1::10::4::978300760\n1::20::5::978300761\n2::10::3::978300762\n")
    write(
        "ml/movies.dat",
        "10::Les Mis\xe9rables (1995)::Drama\n20::Toy Story (1995)::Animation|Comedy\n".encode("latin-1"),
    )
    raw = load_movielens(tmp_path / "ml")
    _assert_canonical(raw.interactions)
    assert raw.interactions.row(0) == ("1", "10", 978300760, "rating", 4.0, "movies")
    assert raw.items is not None
    assert raw.items.select("item_id", "title", "category").rows() == [
        ("10", "Les Misérables (1995)", "Drama"),
        ("20", "Toy Story (1995)", "Animation|Comedy"),
    ]


def test_movielens_csv_with_quoted_movies(write: WriteFile, tmp_path: Path) -> None:
    write("ml/ratings.csv", "userId,movieId,rating,timestamp\n1,10,3.5,100\n1,20,4.0,101\n")
    write(
        "ml/movies.csv",
        'movieId,title,genres\n10,"American President, The (1995)",Comedy\n20,Heat (1995),Action\n',
    )
    raw = load_movielens(tmp_path / "ml")
    assert raw.interactions.select("item_id", "value").rows() == [("10", 3.5), ("20", 4.0)]
    assert raw.items is not None
    assert raw.items["title"][0] == "American President, The (1995)"


def test_p5_items_header_is_checked(write: WriteFile, tmp_path: Path) -> None:
    write("d/user_sequence.txt", "u1 a b c\n")
    write("d/items.csv", "item_id,name\na,Alpha\n")
    with pytest.raises(DataError, match=r"items.csv, line 1: header .* lacks column\(s\) \['title'\]"):
        load_amazon_p5(tmp_path / "d")


# --- the P5 sequences read batch by batch ---------------------------------------------------------------


def _streamed(path: Path, batch_bytes: int) -> pl.DataFrame:
    return pl.concat(open_amazon_p5(path).batches(batch_bytes)).drop("line")


@pytest.mark.parametrize("batch_bytes", [1, 5, 13, 1 << 20])
def test_p5_stream_equals_the_eager_load_whatever_the_batch(p5_dir: Path, batch_bytes: int) -> None:
    eager = load_amazon_p5(p5_dir).interactions
    assert eager.select("user_id", "item_id", "ts").rows() == [
        ("u1", "a", 0), ("u1", "b", 1), ("u1", "c", 2), ("u1", "d", 3),
        ("u2", "b", 0), ("u2", "c", 1), ("u2", "e", 2),
        ("u3", "a", 0), ("u3", "c", 1), ("u3", "e", 2), ("u3", "f", 3),
    ]  # fmt: skip
    assert _streamed(p5_dir, batch_bytes).equals(eager)


def test_p5_stream_of_gzip_crlf_bom_and_blank_lines(write: WriteFile) -> None:
    text = "\ufeffu1 a  b\tc\r\n\r\n\nu2 b c e\r\nu3 a c e f"  # no final line break
    path = write("seq/user_sequence.txt.gz", text, gz=True)
    batches = list(open_amazon_p5(path).batches(4))
    rows = pl.concat(batches)
    assert len(batches) > 1
    assert rows.filter(pl.col("ts") == 0).select("line", "user_id").rows() == [(1, "u1"), (4, "u2"), (5, "u3")]
    assert rows.filter(pl.col("user_id") == "u1")["item_id"].to_list() == ["a", "b", "c"]
    assert rows.drop("line").equals(load_amazon_p5(path).interactions)


def test_p5_stream_reads_the_catalog_when_opened(p5_dir: Path) -> None:
    stream = open_amazon_p5(p5_dir)
    assert stream.items is not None and stream.items.height == 6
    assert stream.size_bytes == (p5_dir / "user_sequence.txt").stat().st_size
    assert [p.name for p in stream.files] == ["user_sequence.txt", "items.csv"]
