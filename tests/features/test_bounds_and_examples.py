"""The online API's bounds on raw data (times in 0..MAX_TIMESTAMP, finite values, no stray quote in an unquoted file),
and the policies naming the rows, users and items they drop, in the log and in meta.json.

The first tests replay the inputs of an outside probe that `recsys data prepare` once took with exit 0.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import features.prepare as prepare_module
from cli.data import app
from features.loaders import load_amazon_p5, load_amazon_raw, load_movielens, open_amazon_p5
from features.policies import MAX_EXAMPLES, PolicyOutcome, apply_policies
from features.prepare import prepare
from features.raw import RawDataset
from features.settings import PrepareSettings
from recsys.data.schema import MAX_TIMESTAMP, META_FILE
from recsys.errors import DataError

WriteFile = Callable[..., Path]
runner = CliRunner()

CSV_HEADER = "userId,movieId,rating,timestamp\n"
GOOD_CSV_ROWS = "1,11,4,978300760\n1,12,4,978300761\n1,13,4,978300762\n"
TIME_FIX = f"Fix: give the time in unix seconds, 0..{MAX_TIMESTAMP} (divide milliseconds by 1000); or remove the line"


def _review(user: str, item: str, time: int) -> str:
    return json.dumps({"reviewerID": user, "asin": item, "unixReviewTime": time, "overall": 5.0})


PROBES = {  # name: (source, file, content, the message after "<file>, line <n>: ", the fix)
    "ratings.csv timestamp -978300000": (
        "movielens",
        "ratings.csv",
        CSV_HEADER + "1,10,4,-978300000\n" + GOOD_CSV_ROWS,
        f"timestamp -978300000 is before 1970-01-01: times are unix seconds in 0..{MAX_TIMESTAMP}",
        TIME_FIX,
    ),
    "ratings.csv timestamp 10^17": (
        "movielens",
        "ratings.csv",
        CSV_HEADER + f"1,10,4,{10**17}\n" + GOOD_CSV_ROWS,
        f"timestamp {10**17} is after 2100-01-01 (milliseconds or nanoseconds?)",
        TIME_FIX,
    ),
    "rating nan": (
        "movielens",
        "ratings.csv",
        CSV_HEADER + "1,10,nan,978300759\n" + GOOD_CSV_ROWS,
        "rating 'nan' is not a finite number",
        "Fix: give a finite rating, or remove the line",
    ),
    "amazon-raw unixReviewTime -5": (
        "amazon-raw",
        "reviews_Toys_5.json",
        "\n".join(_review("u", item, time) for item, time in (("a", -5), ("b", 6), ("c", 7))) + "\n",
        "unixReviewTime -5 is before 1970-01-01",
        TIME_FIX,
    ),
    "unbalanced quote in ratings.csv": (
        "movielens",
        "ratings.csv",
        CSV_HEADER + '"1,2,3,978300759\n' + GOOD_CSV_ROWS,
        "userId '\"1' holds a quote character, but ratings.csv is not quoted (a stray or unbalanced quote?)",
        "Fix: remove the quote characters from the line: the file holds plain ids and numbers, never quoted",
    ),
}


@pytest.mark.parametrize("probe", list(PROBES))
def test_probe_input_exits_2_naming_file_line_and_fix(write: WriteFile, tmp_path: Path, probe: str) -> None:
    source, name, content, problem, fix = PROBES[probe]
    path = write(f"raw/{name}", content)
    out = tmp_path / "prepared"
    args = ["prepare", "--source", source, "--input", str(path), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = 1 if source == "amazon-raw" else 2
    assert f"error: {path}, line {line}: {problem}" in result.stderr
    assert fix in result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["raw"]  # no temp directory left beside the output


@pytest.mark.parametrize("time", [0, MAX_TIMESTAMP])
def test_time_bounds_are_inclusive_as_in_the_api(write: WriteFile, time: int) -> None:
    path = write("ratings.dat", f"1::10::4::{time}\n")
    assert load_movielens(path).interactions["ts"].to_list() == [time]


@pytest.mark.parametrize(
    ("ratings", "problem"),
    [
        (f"1::10::4::{MAX_TIMESTAMP + 1}", f"Timestamp {MAX_TIMESTAMP + 1} is after 2100-01-01"),
        ("1::10::4::978300760000", "Timestamp 978300760000 is after 2100-01-01 (milliseconds or nanoseconds?)"),
        ("1::10::inf::978300760", "Rating 'inf' is not a finite number"),
        ("1::10::1e40::978300760", "Rating '1e40' is not a finite number"),  # finite text, infinite as a float32
        ('1::"10"::4::978300760', "MovieID '\"10\"' holds a quote character, but ratings.dat is not quoted"),
    ],
)
def test_ratings_dat_is_held_to_the_same_bounds(write: WriteFile, ratings: str, problem: str) -> None:
    path = write("ratings.dat", f"1::9::4::978300759\n{ratings}\n")
    with pytest.raises(DataError) as info:
        load_movielens(path)
    assert str(info.value).startswith(f"{path}, line 2: {problem}")


def test_review_rating_nan_is_refused(write: WriteFile) -> None:
    bad = '{"reviewerID": "u", "asin": "b", "unixReviewTime": 6, "overall": NaN}'  # Python's json writes NaN
    path = write("reviews_Toys.json", f"{_review('u', 'a', 5)}\n{bad}\n")
    with pytest.raises(DataError) as info:
        load_amazon_raw(path)
    assert str(info.value).startswith(f"{path}, line 2: overall 'nan' is not a finite number")


def test_p5_positions_need_no_bound(write: WriteFile) -> None:
    path = write("user_sequence.txt", "u1 " + " ".join(f"i{k}" for k in range(50)) + "\n")
    assert load_amazon_p5(path).interactions["ts"].to_list() == list(range(50))


# --- the policies name what they drop ------------------------------------------------------------------

RATINGS = (
    CSV_HEADER
    + "1,10,4,1\n1,11,4,2\n1,10,4,1\n1,12,4,3\n"  # line 4 repeats line 2
    + "2,10,3,5\n"  # line 6: user 2 has one interaction
    + "\n"
    + "3,99,4,1\n3,10,4,2\n3,11,1,3\n"  # line 8: item 99 is not in movies.csv; user 3 is left with two
)
MOVIES = "movieId,title,genres\n10,A,x\n11,B,y\n12,C,z\n13,D,w\n"  # 13: nobody rated it
EXAMPLES = {
    "duplicate_interactions": [{"line": 4, "user_id": "1", "item_id": "10"}],
    "unknown_items": [{"line": 8, "user_id": "3", "item_id": "99"}],
    "min_interactions": [
        {"line": 6, "user_id": "2", "interactions": 1},
        {"line": 9, "user_id": "3", "interactions": 2},
    ],
    "items_without_interactions": [{"item_id": "13"}],
}


def test_policy_examples_reach_meta_json_and_the_log(
    write: WriteFile, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write("ml/movies.csv", MOVIES)
    ratings = write("ml/ratings.csv", RATINGS)
    with caplog.at_level(logging.INFO, logger="features.policies"):
        summary = prepare(load_movielens(ratings.parent), tmp_path / "out")
    meta = json.loads((tmp_path / "out" / META_FILE).read_text())
    assert {policy["name"]: policy["examples"] for policy in meta["policies"]} == EXAMPLES
    assert {policy.name: [dict(e) for e in policy.examples] for policy in summary.policies} == EXAMPLES
    assert "policy duplicate_interactions=drop: 1 exact duplicate rows dropped; e.g. line 4: user '1', item '10'" in (
        caplog.text
    )
    assert "e.g. line 8: user '3', item '99'" in caplog.text
    assert "(3 rows); e.g. line 6: user '2', 1 interactions; line 9: user '3', 2 interactions" in caplog.text
    assert "catalog items without interactions dropped; e.g. item '13'" in caplog.text


def test_examples_without_lines_name_the_position_as_loaded() -> None:
    rows = {"user_id": ["u"] * 4 + ["v"], "item_id": ["a", "b", "a", "c", "a"], "ts": [1, 2, 1, 3, 1]}
    clean = apply_policies(RawDataset(pl.DataFrame(rows), None, "test"), PrepareSettings())
    examples = {outcome.name: list(outcome.examples) for outcome in clean.outcomes}
    assert examples["duplicate_interactions"] == [{"interaction": 3, "user_id": "u", "item_id": "a"}]
    assert examples["min_interactions"] == [{"interaction": 5, "user_id": "v", "interactions": 1}]


@pytest.mark.parametrize("partitions", [1, 3])
def test_examples_are_the_first_in_the_file_whatever_the_parts(
    write: WriteFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int
) -> None:
    monkeypatch.setattr(prepare_module, "MAX_BATCH_BYTES", 7)  # many batches, as a large input
    short_users = [f"s{k} a b" for k in range(MAX_EXAMPLES + 3)]  # lines 2..9: one more user than named
    path = write("user_sequence.txt", "\n".join(["u1 a b c a", *short_users, "u2 a b c"]) + "\n")
    prepare(open_amazon_p5(path), tmp_path / "out", PrepareSettings(partitions=partitions))
    meta = json.loads((tmp_path / "out" / META_FILE).read_text())
    policies = {policy["name"]: policy for policy in meta["policies"]}
    assert policies["min_interactions"]["count"] == MAX_EXAMPLES + 3
    named = policies["min_interactions"]["examples"]
    assert named == [{"line": k + 2, "user_id": f"s{k}", "interactions": 2} for k in range(MAX_EXAMPLES)]
    assert policies["duplicate_interactions"]["examples"] == []  # "a" at positions 0 and 3: different ts


def test_an_outcome_read_back_from_an_older_meta_json_has_no_examples() -> None:
    old = {"name": "unknown_items", "setting": "drop", "count": 0, "detail": "none"}
    outcome = PolicyOutcome.from_dict(old)
    assert outcome.examples == ()
    assert outcome.to_dict() == {**old, "examples": []}
    assert outcome.text() == "unknown_items=drop: 0 none"
