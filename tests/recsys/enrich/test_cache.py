"""The enrichment cache: a cache of the format before its version keeps working; rows that fail their check (an
older version's, or a bad records file's) are dropped with a warning and asked again, never a crash; a file that is
not a cache is refused with its fix, and left as it was."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pytest

from pipelines.enrich import enrich_step
from recsys.enrich.answer import Answer, answer_key
from recsys.enrich.cache import CACHE_FILE, FORMAT_VERSION, EnrichCache
from recsys.errors import DataError
from tests.chat_server import ChatServer
from tests.recsys.enrich.test_http_backend import catalogue, config

# the table as versions before FORMAT_VERSION made it (no user_version)
UNVERSIONED = """CREATE TABLE answers (key TEXT PRIMARY KEY, status TEXT NOT NULL, record TEXT, problem TEXT,
truncated TEXT NOT NULL, attempts INTEGER NOT NULL, seconds REAL NOT NULL, model TEXT NOT NULL,
prompt_version TEXT NOT NULL, backend TEXT NOT NULL, created_at REAL NOT NULL)"""
RECORD = ('{"category": "Beauty > Skin Care", "brand": "Acme", "keywords": ["acme", "lip", "balm"], '
          '"description": "A lip balm.", "queries": ["acme lip", "balm"]}')  # fmt: skip


def answer(text: str, **changes: object) -> Answer:
    fields = {"key": answer_key(text, "item-metadata-v1", "m@1"), "status": "ok", "record": RECORD, "problem": None,
              "truncated": "", "attempts": 1, "seconds": 0.5, "model": "m@1", "prompt_version": "item-metadata-v1",
              "backend": "http", "created_at": time.time(), **changes}  # fmt: skip
    return Answer(**fields)  # type: ignore[arg-type]


def raw_rows(folder: Path, answers: list[Answer]) -> None:
    """`answers` written straight into the table, as an older version (or a bad records file) may have."""
    with sqlite3.connect(folder / CACHE_FILE) as db:
        db.executemany("INSERT INTO answers VALUES (?,?,?,?,?,?,?,?,?,?,?)", [tuple(vars(a).values()) for a in answers])


def test_a_cache_of_before_the_version_keeps_working(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        db.execute(UNVERSIONED)
    raw_rows(tmp_path, [answer("Acme Lip Balm")])
    cache = EnrichCache(tmp_path)
    assert cache.get([answer("Acme Lip Balm").key])[answer("Acme Lip Balm").key].record == RECORD
    cache.close()
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT_VERSION


@pytest.mark.parametrize(
    "bad",
    [{"attempts": "x"}, {"created_at": "yesterday"}, {"seconds": "fast"}, {"status": "weird"}, {"status": "1"},
     {"record": "not json"}, {"record": RECORD.replace('"Acme"', "null")}, {"record": None},
     {"status": "failed", "record": None, "problem": None}, {"key": "short"}],
    ids=["attempts text", "created_at text", "seconds text", "status weird", "status 1", "record not JSON",
         "brand null", "ok without a record", "failed without a reason", "key not a sha256"],
)  # fmt: skip
def test_rows_that_fail_their_check_are_dropped_and_said(
    tmp_path: Path, bad: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    EnrichCache(tmp_path).close()
    good, broken = answer("Acme Lip Balm"), answer("Zest Body Wash", **bad)
    raw_rows(tmp_path, [good, broken])
    cache = EnrichCache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="recsys.enrich.cache"):
        found = cache.get([good.key, broken.key, answer("Zest Body Wash").key])
    assert list(found) == [good.key] and len(cache) == 1  # the bad row is gone: asked again, warned once
    assert "1 answers fail their check" in caplog.text and "asked again" in caplog.text


def test_a_run_over_a_cache_with_bad_rows_asks_them_again(chat_server: ChatServer, tmp_path: Path) -> None:
    """The review's case: wrong-typed rows in the cache crashed every later run; now they are asked again."""
    data = catalogue(tmp_path / "data", ["Acme Lip Balm", "Zest Body Wash", "Nova Face Cream"])
    enrich_step(config(chat_server), data, data, tmp_path / "cache")
    with sqlite3.connect(tmp_path / "cache" / CACHE_FILE) as db:
        db.execute("UPDATE answers SET attempts = 'many' WHERE rowid = 1")
        db.execute("UPDATE answers SET created_at = 'now', status = 'weird' WHERE rowid = 2")
    summary = enrich_step(config(chat_server), data, data, tmp_path / "cache")
    assert (summary.asked, summary.cached, summary.ok) == (2, 1, 3)


def test_a_file_that_is_not_a_cache_is_refused_and_left_alone(tmp_path: Path) -> None:
    garbage = bytes(range(256)) * 64
    (tmp_path / CACHE_FILE).write_bytes(garbage)
    with pytest.raises(DataError, match=r"enrich-cache.sqlite: cannot be opened as an enrich cache .*Fix: move the"):
        EnrichCache(tmp_path)
    assert (tmp_path / CACHE_FILE).read_bytes() == garbage
    (tmp_path / "other").mkdir()
    with sqlite3.connect(tmp_path / "other" / CACHE_FILE) as db:
        db.execute("CREATE TABLE answers (key TEXT, value TEXT)")
    with pytest.raises(DataError, match=r"its table of answers has the columns \['key', 'value'\]"):
        EnrichCache(tmp_path / "other")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DataError, match=r"a-file: the enrich cache's folder cannot be made .*Fix: pass another"):
        EnrichCache(tmp_path / "a-file")
