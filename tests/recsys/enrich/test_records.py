"""A records file given by the user (`records`, `recsys enrich --records`) is checked whole before anything of it
enters the cache: a column of another type or a row that is not a valid answer refuses the file, naming them, and
the cache is left as it was (so no later run is poisoned)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from pipelines.enrich import enrich_step
from recsys.enrich.cache import CACHE_FILE
from recsys.errors import DataError
from tests.chat_server import ChatServer
from tests.recsys.enrich.test_http_backend import catalogue, config

TITLES = ["Acme Lip Balm", "Zest Body Wash", "Nova Face Cream"]


def _status(frame: pl.DataFrame, value: object) -> pl.DataFrame:
    return frame.with_columns(pl.lit(value).alias("status"))


CHANGES: dict[str, tuple[Callable[[pl.DataFrame], pl.DataFrame], str]] = {
    "attempts as text": (lambda f: f.with_columns(pl.col("attempts").cast(pl.String)), "attempts is String, not Int64"),
    "created_at as text": (lambda f: f.with_columns(pl.lit("2024-01-01").alias("created_at")), "created_at is String"),
    "status 1": (lambda f: _status(f, 1), "status is Int32, not String"),
    "status weird": (lambda f: _status(f, "weird"), "row 1 (item 'i0'): status: 'weird' is not one of ok, failed"),
    "keywords a string": (lambda f: f.with_columns(pl.lit("acme lip balm").alias("keywords")), "keywords is String"),
    "a 100,000-character description": (
        lambda f: f.with_columns(pl.lit("x" * 100_000).alias("description")),
        "description: String should have at most 400 characters",
    ),
    "a null category": (lambda f: f.with_columns(pl.lit(None, pl.String).alias("category")), "category: Input should"),
    "a category off the prompt's list": (
        lambda f: f.with_columns(pl.lit("Toys > Robots").alias("category")),
        "category 'Toys > Robots' is not in the prompt's list",
    ),
    "a failed row without its reason": (
        lambda f: _status(f, "failed").with_columns(pl.lit(None, pl.String).alias("problem")),
        "problem: a failed answer needs its reason",
    ),
    "attempts 0": (
        lambda f: f.with_columns(pl.lit(0, pl.Int64).alias("attempts")),
        "attempts: 0 is not a whole number",
    ),
    "seconds NaN": (lambda f: f.with_columns(pl.lit(float("nan")).alias("seconds")), "seconds: nan is not a number"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_bad_records_file_is_refused_whole_and_the_cache_untouched(
    chat_server: ChatServer, tmp_path: Path, change: str
) -> None:
    data = catalogue(tmp_path / "data", TITLES)
    enrich_step(config(chat_server), data, tmp_path / "made", tmp_path / "made-cache")
    alter, says = CHANGES[change]
    records = tmp_path / "records.parquet"
    alter(pl.read_parquet(tmp_path / "made" / "item_metadata.parquet")).write_parquet(records)
    asked = chat_server.requests
    with pytest.raises(DataError, match=rf"records.parquet: .*{re.escape(says)}.*Fix: "):
        enrich_step(config(chat_server, records=str(records)), data, tmp_path / "out", tmp_path / "cache")
    assert not (tmp_path / "cache" / CACHE_FILE).exists() and chat_server.requests == asked  # nothing taken or asked
    summary = enrich_step(config(chat_server), data, tmp_path / "out", tmp_path / "cache")  # a later run is fine
    assert summary.ok == len(TITLES)


def test_a_records_file_that_is_not_parquet_is_refused(chat_server: ChatServer, tmp_path: Path) -> None:
    data = catalogue(tmp_path / "data", TITLES)
    (tmp_path / "records.parquet").write_bytes(b"PAR1 but not really" * 100)
    with pytest.raises(DataError, match=r"records.parquet: not a readable parquet file .*Fix: give the item_metadata"):
        enrich_step(config(chat_server, records=str(tmp_path / "records.parquet")), data, data, tmp_path / "cache")


def test_the_bad_rows_are_named_and_counted(chat_server: ChatServer, tmp_path: Path) -> None:
    data = catalogue(tmp_path / "data", [f"Brand{n} Lip Balm" for n in range(8)])
    enrich_step(config(chat_server), data, tmp_path / "made", tmp_path / "made-cache")
    records = tmp_path / "records.parquet"
    pl.read_parquet(tmp_path / "made" / "item_metadata.parquet").with_columns(status=pl.lit("done")).write_parquet(
        records
    )
    with pytest.raises(DataError, match=r"8 of 8 rows are not valid answers: row 1 \(item 'i0'\).*row 5 .*and 3 more"):
        enrich_step(config(chat_server, records=str(records)), data, data, tmp_path / "cache")
