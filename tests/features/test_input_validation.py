"""One test per validation case: a `DataError` naming file, line and problem, or a policy with its count."""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

import features.prepare as prepare_module
from features.loaders import load_amazon_p5, load_amazon_raw, load_movielens, open_amazon_p5
from features.policies import PolicyOutcome, apply_policies
from features.prepare import prepare
from features.raw import RawDataset
from features.settings import PrepareSettings, UnknownItems
from features.sources import load_source
from recsys.errors import ConfigError, DataError

WriteFile = Callable[..., Path]


def _error(call: Callable[[], object]) -> DataError:
    with pytest.raises(DataError) as info:
        call()
    return info.value


# --- loader errors -------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    err = _error(lambda: load_amazon_p5(tmp_path / "nowhere"))
    assert "nowhere" in str(err)
    assert "no such file or directory" in str(err)


def test_directory_without_the_expected_file(tmp_path: Path) -> None:
    err = _error(lambda: load_movielens(tmp_path))
    assert str(tmp_path) in str(err)
    assert "ratings.dat or ratings.csv" in str(err)


def test_empty_file(write: WriteFile) -> None:
    path = write("user_sequence.txt", "\n  \n")
    err = _error(lambda: load_amazon_p5(path))
    assert str(err).startswith(f"{path}: file is empty")


def test_empty_gzip_file(write: WriteFile) -> None:
    path = write("ratings.dat.gz", "", gz=True)
    assert "file is empty" in str(_error(lambda: load_movielens(path)))


def test_ratings_dat_line_with_three_fields(write: WriteFile) -> None:
    path = write("ratings.dat", "1::10::4::978300760\n1::20::5\n")
    err = _error(lambda: load_movielens(path))
    assert err.line == 2
    assert str(err).startswith(f"{path}, line 2: expected 4 fields")
    assert "found 3" in str(err)


def test_p5_line_with_only_a_user_id(write: WriteFile) -> None:
    path = write("user_sequence.txt", "u1 a b c\n\nu2\n")
    err = _error(lambda: load_amazon_p5(path))
    assert str(err).startswith(f"{path}, line 3: user 'u2' has no items")


def test_csv_row_with_too_few_fields(write: WriteFile) -> None:
    write("items.csv", "item_id,title\na,Alpha\nb\n")
    path = write("user_sequence.txt", "u1 a b c\n")
    err = _error(lambda: load_amazon_p5(path))
    assert str(err).startswith(f"{path.parent / 'items.csv'}, line 3: expected 2 fields")
    assert "found 1" in str(err)


def test_ratings_csv_row_with_too_few_fields(write: WriteFile) -> None:
    path = write("ratings.csv", "userId,movieId,rating,timestamp\n1,10,3.5,100\n1,20,4.0\n")
    assert str(_error(lambda: load_movielens(path))).startswith(f"{path}, line 3: expected 4 fields")


def test_non_numeric_timestamp(write: WriteFile) -> None:
    path = write("ratings.dat", "1::10::4::978300760\n1::20::5::soon\n")
    err = _error(lambda: load_movielens(path))
    assert str(err).startswith(f"{path}, line 2: Timestamp 'soon' is not an integer")


def test_non_numeric_rating_in_reviews(write: WriteFile) -> None:
    good = '{"reviewerID": "u1", "asin": "a", "unixReviewTime": 1, "overall": 5}'
    bad = '{"reviewerID": "u1", "asin": "b", "unixReviewTime": 2, "overall": "great"}'
    path = write("reviews_Toys.json", f"{good}\n{bad}\n")
    assert str(_error(lambda: load_amazon_raw(path))).startswith(f"{path}, line 2: overall 'great' is not a number")


def test_malformed_json_line(write: WriteFile) -> None:
    good = '{"reviewerID": "u1", "asin": "a", "unixReviewTime": 1, "overall": 5}'
    path = write("reviews_Toys.json.gz", f"{good}\n{good}\n{{broken\n", gz=True)
    assert str(_error(lambda: load_amazon_raw(path))).startswith(f"{path}, line 3: not a JSON object")


def test_missing_json_field(write: WriteFile) -> None:
    path = write("reviews_Toys.json", '{"reviewerID": "u1", "asin": "a", "overall": 5}\n')
    err = _error(lambda: load_amazon_raw(path))
    assert str(err).startswith(f"{path}, line 1: unixReviewTime is missing or empty")


@pytest.mark.parametrize("gz", [False, True])
def test_bad_encoding_reports_the_line(write: WriteFile, gz: bool) -> None:
    path = write("user_sequence.txt" + (".gz" if gz else ""), b"u1 a b c\nu2 b c d\nu3 \xff b c\n", gz=gz)
    err = _error(lambda: load_amazon_p5(path))
    assert err.line == 3
    assert str(err).startswith(f"{path}, line 3: bytes ff at byte offset 21 are not valid UTF-8")
    assert "iconv" in err.fix


def test_user_on_two_lines_names_both(write: WriteFile) -> None:
    path = write("user_sequence.txt", "u1 a b c\nu2 a b c\nu1 d e f\n")
    err = _error(lambda: load_amazon_p5(path))
    assert str(err).startswith(f"{path}, line 3: user id 'u1' appears on line 1 and again on line 3")


# --- the same errors when the sequences are read batch by batch (`recsys data prepare`) ----------------


@pytest.fixture
def seven_byte_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prepare reads its input 1-7 bytes at a time (a tiny memory budget would also trip the memory check)."""
    monkeypatch.setattr(prepare_module, "MAX_BATCH_BYTES", 7)


def _prepare_stream(path: Path, tmp_path: Path, **options: object) -> DataError:
    """The `DataError` of preparing `path` (in batches of `seven_byte_batches`), in 3 parts."""
    settings = PrepareSettings(partitions=3, **options)  # type: ignore[arg-type]
    return _error(lambda: prepare(open_amazon_p5(path), tmp_path / "out", settings))


@pytest.mark.parametrize("batch_bytes", [1, 2, 7, 1 << 20])
def test_stream_errors_keep_their_lines_across_batches(write: WriteFile, batch_bytes: int) -> None:
    no_items = write("a/user_sequence.txt", "u1 a b c\n\nu2\n")
    err = _error(lambda: list(open_amazon_p5(no_items).batches(batch_bytes)))
    assert str(err).startswith(f"{no_items}, line 3: user 'u2' has no items")
    for gz in (False, True):
        bad = write("b/user_sequence.txt" + (".gz" if gz else ""), b"u1 a b c\nu2 b c d\nu3 \xff b c\n", gz=gz)
        err = _error(lambda: list(open_amazon_p5(bad).batches(batch_bytes)))  # noqa: B023 - called at once
        assert str(err).startswith(f"{bad}, line 3: bytes ff at byte offset 21 are not valid UTF-8")
    empty = write("c/user_sequence.txt", "\n  \n")
    assert str(_error(lambda: list(open_amazon_p5(empty).batches(batch_bytes)))).startswith(f"{empty}: file is empty")


@pytest.mark.parametrize("cut", [4, 20])  # inside the trailer (CRC, size) or inside the data
def test_truncated_gzip_is_corrupt_read_whole_or_in_batches(write: WriteFile, cut: int) -> None:
    data = gzip.compress(b"u1 a b c\nu2 b c d\nu3 a c d\n" * 50)
    path = write("user_sequence.txt.gz", data[:-cut])
    for read in (lambda: load_amazon_p5(path), lambda: list(open_amazon_p5(path).batches(8))):
        assert str(_error(read)).startswith(f"{path}: corrupt gzip data")


def test_gzip_of_several_members_is_read_to_the_end(write: WriteFile) -> None:
    path = write("user_sequence.txt.gz", gzip.compress(b"u1 a b c\n") + gzip.compress(b"u2 b c d\n"))
    assert load_amazon_p5(path).interactions["user_id"].to_list() == ["u1"] * 3 + ["u2"] * 3


@pytest.mark.usefixtures("seven_byte_batches")
def test_stream_user_on_two_lines_in_any_part(write: WriteFile, tmp_path: Path) -> None:
    path = write("user_sequence.txt", "u1 a b c\nu2 a b c\nu3 a b c\nu2 d e f\nu1 d e f\n")
    expected = f"{path}, line 4: user id 'u2' appears on line 2 and again on line 4"  # the first repeat in the file
    assert str(_error(lambda: load_amazon_p5(path))).startswith(expected)
    assert str(_prepare_stream(path, tmp_path)).startswith(expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("seven_byte_batches")
def test_stream_unknown_item_error_names_its_line(write: WriteFile, tmp_path: Path) -> None:
    write("items.csv", "item_id,title\na,A\nb,B\nc,C\n")
    path = write("user_sequence.txt", "u1 a b c\nu2 a a b c\nu3 a b x c\n")
    err = _prepare_stream(path, tmp_path, unknown_items="error")
    assert str(err).startswith(f"{path}, line 3: item 'x' of user 'u3' (interaction 10) is not in the item catalog")


def test_item_twice_in_catalog_names_both(write: WriteFile) -> None:
    write("items.csv", "item_id,title\na,Alpha\nb,Bravo\na,Again\n")
    path = write("user_sequence.txt", "u1 a b c\n")
    err = _error(lambda: load_amazon_p5(path))
    assert "items.csv, line 4: item id 'a' appears on line 2 and again on line 4" in str(err)


def test_corrupt_gzip(write: WriteFile) -> None:
    path = write("ratings.dat.gz", b"\x1f\x8b\x08\x00garbage")
    assert "corrupt gzip data" in str(_error(lambda: load_movielens(path)))


def test_unbalanced_quote_in_catalog_names_the_line_where_it_opens(write: WriteFile) -> None:
    write("items.csv", 'item_id,title\na,"Alpha\nb,Bravo\nc,Charlie\n')  # a's title would swallow b and c
    path = write("user_sequence.txt", "u1 a b c\n")
    err = _error(lambda: load_amazon_p5(path))
    assert str(err).startswith(f"{path.parent / 'items.csv'}, line 2: unbalanced quotes")
    assert 'Fix: close the quote on that line, and double a quote that is part of the text ("")' in str(err)


def test_quoted_line_break_in_catalog_is_refused(write: WriteFile) -> None:
    write("ml/ratings.csv", "userId,movieId,rating,timestamp\n1,10,3.5,100\n")
    path = write("ml/movies.csv", 'movieId,title,genres\n10,"Heat\n(1995)",Action\n20,Up,Comedy\n')
    err = _error(lambda: load_movielens(path.parent))
    assert str(err).startswith(f"{path}, line 2: a quoted field runs on to line 3")
    assert "write a line break inside a field as a space" in str(err)


def test_quote_left_open_at_the_end_of_the_catalog(write: WriteFile) -> None:
    write("items.csv", 'item_id,title\na,Alpha\nb,"Bravo')
    path = write("user_sequence.txt", "u1 a b c\n")
    assert str(_error(lambda: load_amazon_p5(path))).startswith(f"{path.parent / 'items.csv'}, line 3: unbalanced")


def test_unreadable_catalog(write: WriteFile) -> None:
    catalog = write("items.csv", "item_id,title\na,Alpha\n")
    path = write("user_sequence.txt", "u1 a b c\n")
    catalog.chmod(0)
    if os.access(catalog, os.R_OK):
        pytest.skip("this user (root) reads a file whatever its mode")
    err = _error(lambda: load_amazon_p5(path))
    assert str(err) == f"{catalog}: cannot read it: permission denied. Fix: make it readable (chmod a+r {catalog})"


def test_catalog_that_is_a_directory(write: WriteFile, tmp_path: Path) -> None:
    path = write("user_sequence.txt", "u1 a b c\n")
    (tmp_path / "items.csv").mkdir()
    err = _error(lambda: load_amazon_p5(path))
    assert str(err).startswith(f"{tmp_path / 'items.csv'}: is a directory, expected a file. Fix:")


@pytest.mark.parametrize(
    ("source", "name", "reads"),
    [
        ("amazon-p5", "items.csv", "user_sequence.txt (or that file itself)"),
        ("movielens", "movies.csv", "ratings.dat or ratings.csv (or that file itself)"),
        ("amazon-raw", "meta_Toys.json", "one reviews_*.json(.gz)"),
        ("amazon-p5-domains", "user_sequence.txt", "one P5 folder per domain"),
    ],
)
def test_an_input_file_the_source_does_not_read(write: WriteFile, source: str, name: str, reads: str) -> None:
    path = write(name, "item_id,title\na,Alpha\n")
    err = _error(lambda: load_source(source, path))
    assert str(err).startswith(f"{path}: is a file; source {source} reads a directory holding {reads}")
    assert str(err).endswith("Fix: pass the directory")


# --- policies (applied after loading) ------------------------------------------------------------------


def _raw(rows: list[tuple[str, str, int]], items: list[str] | None = None) -> RawDataset:
    interactions = pl.DataFrame(rows, schema={"user_id": pl.String, "item_id": pl.String, "ts": pl.Int64}, orient="row")
    catalog = None if items is None else pl.DataFrame({"item_id": items, "title": [f"T{i}" for i in items]})
    return RawDataset(interactions, catalog, "test", (Path("interactions.txt"),))


def _counts(outcomes: tuple[PolicyOutcome, ...]) -> dict[str, int]:
    return {outcome.name: outcome.count for outcome in outcomes}


def test_exact_duplicates_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    rows = [("u", "a", 1), ("u", "b", 2), ("u", "a", 1), ("u", "c", 3), ("u", "a", 4)]
    with caplog.at_level(logging.INFO, logger="features.policies"):
        clean = apply_policies(_raw(rows), PrepareSettings())
    assert clean.interactions.rows() == [("u", "a", 1), ("u", "b", 2), ("u", "c", 3), ("u", "a", 4)]
    assert _counts(clean.outcomes)["duplicate_interactions"] == 1
    assert "policy duplicate_interactions=drop: 1" in caplog.text


def test_short_users_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    rows = [("u1", "a", 1), ("u1", "b", 2), ("u1", "c", 3), ("u2", "a", 1), ("u2", "b", 2)]
    with caplog.at_level(logging.INFO, logger="features.policies"):
        clean = apply_policies(_raw(rows), PrepareSettings(min_interactions=3))
    assert set(clean.interactions["user_id"]) == {"u1"}
    assert _counts(clean.outcomes)["min_interactions"] == 1
    assert "policy min_interactions=3: 1 users with fewer than 3 interactions dropped (2 rows)" in caplog.text


def test_min_interactions_below_three_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"min_interactions: must be >= 3 \(leave-one-out"):
        PrepareSettings.checked(min_interactions=2)


UNKNOWN_ROWS = [
    ("u1", "a", 1),
    ("u1", "x", 2),
    ("u1", "b", 3),
    ("u1", "c", 4),
    ("u2", "a", 1),
    ("u2", "b", 2),
]


def test_unknown_items_dropped_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="features.policies"):
        clean = apply_policies(_raw(UNKNOWN_ROWS, items=["a", "b", "c", "z"]), PrepareSettings())
    assert "x" not in set(clean.interactions["item_id"])
    counts = _counts(clean.outcomes)
    assert counts["unknown_items"] == 1
    assert counts["min_interactions"] == 1  # u2 had 2 interactions
    assert counts["items_without_interactions"] == 1  # z
    assert "policy unknown_items=drop: 1" in caplog.text
    assert sorted(clean.items["item_id"]) == ["a", "b", "c"]


def test_unknown_items_kept_with_empty_title() -> None:
    clean = apply_policies(_raw(UNKNOWN_ROWS, items=["a", "b", "c"]), PrepareSettings(unknown_items=UnknownItems.KEEP))
    titles = dict(clean.items.select("item_id", "title").iter_rows())
    assert titles["x"] == ""
    assert titles["a"] == "Ta"
    assert _counts(clean.outcomes)["unknown_items"] == 1


def test_unknown_items_error_names_item_user_and_row() -> None:
    err = _error(
        lambda: apply_policies(
            _raw(UNKNOWN_ROWS, items=["a", "b", "c"]), PrepareSettings(unknown_items=UnknownItems.ERROR)
        )
    )
    assert str(err).startswith("interactions.txt: item 'x' of user 'u1' (interaction 2) is not in the item catalog")
    assert "--unknown-items" in err.fix


def test_unknown_items_policy_name_is_checked() -> None:
    with pytest.raises(ConfigError, match="unknown_items: Input should be 'drop', 'keep' or 'error'"):
        PrepareSettings.checked(unknown_items="ignore")


def test_nothing_left_is_an_error() -> None:
    err = _error(lambda: apply_policies(_raw([("u", "a", 1)]), PrepareSettings()))
    assert "no interactions left after the policies" in str(err)
