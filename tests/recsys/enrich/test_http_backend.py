"""The HTTP backend against a chat-completions server (conftest: the project's own, scripted per item): answers,
repairs, re-asks once, retries a 429, falls back when the schema is refused, spends no more than its token budget,
and a run killed mid-way resumes with only what is missing."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from pipelines.enrich import enrich_step
from recsys.enrich.cache import CACHE_FILE
from recsys.enrich.config import EnrichConfig
from recsys.enrich.record import DEFAULT_PROMPT
from recsys.errors import ConfigError, DataError
from tests.chat_server import ChatServer


def catalogue(folder: Path, titles: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"i{n}" for n in range(len(titles))]
    pl.DataFrame({"item_idx": list(range(1, len(titles) + 1)), "item_id": ids, "title": titles}).write_parquet(
        folder / "items.parquet"
    )
    return folder


def config(server: ChatServer, **changes: object) -> EnrichConfig:
    return EnrichConfig(**{"backend": "http", "model": "test-model", "url": server.url, "batch_size": 2,
                           "max_retries": 2, **changes})  # type: ignore[arg-type]  # fmt: skip


def test_answers_are_checked_repaired_reasked_and_counted(
    chat_server: ChatServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "secret-key")
    data = catalogue(tmp_path / "data", ["Acme Lip Balm", "Zest Body Wash", "Glow malformed Serum",
                                         "Dusk hopeless Toner", "Cream for busy days", ""])  # fmt: skip
    summary = enrich_step(config(chat_server, api_key_env="TEST_LLM_KEY"), data, data, tmp_path / "cache")
    rows = pl.read_parquet(data / "item_metadata.parquet")
    assert (summary.items, summary.ok, summary.failed, summary.left) == (5, 4, 1, 0)  # the empty title: no text
    failed = rows.filter(pl.col("status") == "failed").row(0, named=True)
    assert failed["item_id"] == "i3" and "not JSON" in failed["problem"] and failed["attempts"] == 2
    assert rows.filter(pl.col("item_id") == "i2")["attempts"].item() == 2  # garbage, then valid when re-asked
    assert chat_server.asked["Cream for busy days"] == 2  # the 429, then the answer
    assert chat_server.authorizations == {"Bearer secret-key"}
    assert rows.filter(pl.col("item_id") == "i0").row(0, named=True)["keywords"] == ["acme", "lip", "balm"]
    assert set(rows["model"]) == {f"test-model@{chat_server.url}"} and set(rows["prompt_version"]) == {DEFAULT_PROMPT}
    again = enrich_step(config(chat_server), data, data, tmp_path / "cache")  # everything is in the cache
    assert (again.asked, again.cached, again.ok) == (0, 5, 4) and sum(chat_server.asked.values()) == 8
    retried = enrich_step(config(chat_server), data, data, tmp_path / "cache", retry_failed=True)
    assert retried.asked == 1 and retried.failed == 1


def test_a_server_that_refuses_the_schema_is_asked_without_it(chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.accepts_schema = False
    data = catalogue(tmp_path / "data", ["Acme Lip Balm", "Zest Body Wash", "Nova Face Cream"])
    summary = enrich_step(config(chat_server, concurrency=1), data, data, tmp_path / "cache")
    assert summary.ok == 3 and chat_server.schemas_refused == 1


def test_the_token_budget_leaves_the_rest_for_the_next_run(chat_server: ChatServer, tmp_path: Path) -> None:
    data = catalogue(tmp_path / "data", [f"Brand{n} Body Lotion" for n in range(6)])
    first = enrich_step(config(chat_server, concurrency=1, token_budget=250), data, data, tmp_path / "cache")
    assert (first.ok, first.left) == (3, 3)  # 100 tokens an answer: the third one crosses 250
    assert pl.read_parquet(data / "item_metadata.parquet").height == 3
    second = enrich_step(config(chat_server, concurrency=1), data, data, tmp_path / "cache")
    assert (second.asked, second.cached, second.ok) == (3, 3, 6)
    assert max(chat_server.asked.values()) == 1  # nothing asked twice


def test_a_killed_run_resumes_with_only_what_is_missing(chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.delay_s = 0.3
    titles = [f"Brand{n} Dry Shampoo" for n in range(8)]
    data = catalogue(tmp_path / "data", titles)
    command = [sys.executable, "-m", "cli", "enrich", "--data-dir", str(data), "--backend", "http", "--model",
               "test-model", "--url", chat_server.url, "--batch-size", "1",
               "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _cached(tmp_path / "cache" / CACHE_FILE) < 3 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    cached = _cached(tmp_path / "cache" / CACHE_FILE)
    assert 3 <= cached < len(titles), "the run was not killed mid-way"
    assert not (data / "item_metadata.parquet").exists()  # written at the end, whole, or not at all
    summary = enrich_step(config(chat_server), data, data, tmp_path / "cache")
    assert summary.cached == cached and summary.asked == len(titles) - cached and summary.ok == len(titles)
    assert sum(chat_server.asked.values()) <= len(titles) + 1  # at most the request under way when killed, again


def test_an_http_config_without_a_url_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"needs enrich\.url"):
        EnrichConfig(backend="http")


def _cached(path: Path) -> int:
    if not path.exists():
        return 0
    with sqlite3.connect(path, timeout=5) as db:
        try:
            return int(db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])
        except sqlite3.OperationalError:  # the table is not there yet
            return 0


def test_records_made_elsewhere_are_reused_and_never_asked_again(chat_server: ChatServer, tmp_path: Path) -> None:
    data = catalogue(tmp_path / "data", ["Acme Lip Balm", "Zest Body Wash", "Dusk hopeless Toner"])
    made = enrich_step(config(chat_server), data, tmp_path / "made", tmp_path / "cache")
    assert (made.ok, made.failed) == (2, 1)
    asked = sum(chat_server.asked.values())
    # another machine: an empty cache, the records file, and a server that answers nothing (nothing may be asked)
    records = str(tmp_path / "made" / "item_metadata.parquet")
    elsewhere = EnrichConfig(backend="http", model="test-model", url=chat_server.url, records=records)
    again = enrich_step(elsewhere, data, tmp_path / "again", tmp_path / "other-cache")
    assert (again.asked, again.cached, again.ok, again.failed) == (0, 3, 2, 1)
    assert sum(chat_server.asked.values()) == asked
    columns = ["item_id", "status", "category", "keywords", "description", "queries", "problem"]
    assert (
        pl.read_parquet(tmp_path / "again" / "item_metadata.parquet")
        .select(columns)
        .equals(pl.read_parquet(records).select(columns))
    )


def test_a_records_file_of_another_shape_is_refused_with_its_fix(chat_server: ChatServer, tmp_path: Path) -> None:
    data = catalogue(tmp_path / "data", ["Acme Lip Balm"])
    old = tmp_path / "old.parquet"
    pl.DataFrame({"item_id": ["i0"], "status": ["ok"]}).write_parquet(old)
    with pytest.raises(DataError, match=r"old.parquet: no column .*'key'.*Fix: enrich again"):
        enrich_step(config(chat_server, records=str(old)), data, data, tmp_path / "cache")
