"""The HTTP backend against a server that misbehaves (tests/chat_server.py's MISBEHAVIOURS, on a real loopback port):
every answer is validated before it is used, a bad one is the item's transient failure (retried, never cached, never
a crash) and the good answers got around it are kept; an outage stops the run early with a clear error and caches
nothing as failed; every request is bounded in total time, a trickling server included."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pytest

from pipelines.enrich import enrich_step
from recsys.enrich.backend import BackendUnavailable
from recsys.enrich.cache import EnrichCache
from recsys.enrich.http import HttpBackend, HttpSettings
from recsys.enrich.record import load_prompt
from tests.chat_server import ChatServer, closed_port_url
from tests.recsys.enrich.test_http_backend import catalogue, config

PROMPT = load_prompt()
BAD_ANSWERS = ["html", "list", "no-choices", "usage-text", "usage-lots", "huge", "drop", "error-500", "rate-limited"]


def backend(url: str, **changes: object) -> HttpBackend:
    settings = {"url": url, "model": "test-model", "api_key_env": None, "max_retries": 2, "backoff_s": 0.05,
                "max_wait_s": 0.2, **changes}  # fmt: skip
    return HttpBackend(HttpSettings(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize("misbehaviour", BAD_ANSWERS)
def test_a_bad_answer_is_retried_and_never_used(chat_server: ChatServer, misbehaviour: str) -> None:
    chat_server.misbehaviour, chat_server.every = misbehaviour, 2  # every other request
    answers = backend(chat_server.url, concurrency=1).generate([f"Brand{n} Lip Balm" for n in range(4)], PROMPT)
    assert [a.error for a in answers] == [None] * 4 and all(a.text and a.text.startswith("{") for a in answers)
    assert chat_server.requests == 8  # each item: the bad answer, then the good one


@pytest.mark.parametrize("misbehaviour", [*BAD_ANSWERS, "unauthorized"])
def test_an_item_whose_answers_are_all_bad_is_a_transient_failure(chat_server: ChatServer, misbehaviour: str) -> None:
    chat_server.misbehaviour = misbehaviour
    (answer,) = backend(chat_server.url).generate(["Acme Lip Balm"], PROMPT)
    assert answer.text is None and answer.transient and answer.error
    assert chat_server.requests == (1 if misbehaviour == "unauthorized" else 3)  # a 401 is not retried


@pytest.mark.parametrize(
    ("retry_after", "waits"),
    [("-1", "back-off"), ("nan", "back-off"), ("inf", "back-off"), ("soon", "back-off"),
     ("Wed, 21 Oct 2015 07:28:00 GMT", "back-off"), ("0.3", "0.3 s"), ("1e12", "the cap")],
)  # fmt: skip
def test_a_retry_after_is_honoured_only_where_it_makes_sense(
    chat_server: ChatServer, retry_after: str, waits: str
) -> None:
    chat_server.misbehaviour, chat_server.every, chat_server.retry_after = "rate-limited", 2, retry_after
    began = time.monotonic()
    (answer,) = backend(chat_server.url, backoff_s=0.05, max_wait_s=1.0).generate(["Acme Lip Balm"], PROMPT)
    waited = time.monotonic() - began
    assert answer.error is None and chat_server.requests == 2
    low, high = {"back-off": (0.05, 0.25), "0.3 s": (0.3, 0.5), "the cap": (1.0, 1.2)}[waits]
    assert low <= waited < high, waited


def test_a_trickling_server_is_cut_off_at_the_request_timeout(chat_server: ChatServer) -> None:
    chat_server.misbehaviour, chat_server.trickle_s = "trickle", 0.1  # ~40 s for the whole answer
    began = time.monotonic()
    (answer,) = backend(chat_server.url, timeout_s=1.0, max_retries=1).generate(["Acme Lip Balm"], PROMPT)
    assert time.monotonic() - began < 4  # two attempts of 1 s each, not 40 s
    assert answer.transient and "no whole answer within timeout_s=1 s" in str(answer.error)


def test_an_outage_stops_sending_after_its_failures_in_a_row(chat_server: ChatServer) -> None:
    chat_server.misbehaviour = "error-500"
    down = backend(chat_server.url, max_failures_in_a_row=5, concurrency=2)
    answers = down.generate([f"Brand{n} Lip Balm" for n in range(10)], PROMPT)
    assert all(a.transient for a in answers) and chat_server.requests <= 5 + 2  # the ones in flight finish
    assert down.unavailable is not None and "failed 5 requests in a row (the last: HTTP 500" in down.unavailable


def test_a_run_keeps_its_good_answers_and_asks_only_for_the_rest(chat_server: ChatServer, tmp_path: Path) -> None:
    """The review's case: HTML on every 7th request lost the whole run; now every item is answered, once."""
    chat_server.misbehaviour, chat_server.every = "html", 7
    data = catalogue(tmp_path / "data", [f"Brand{n} Body Lotion" for n in range(40)])
    first = enrich_step(config(chat_server, limit=25), data, data, tmp_path / "cache")
    assert (first.ok, first.failed, first.left) == (25, 0, 15)
    second = enrich_step(config(chat_server), data, data, tmp_path / "cache")
    assert (second.asked, second.cached, second.ok) == (15, 25, 40)
    assert chat_server.requests == 40 + (chat_server.requests + 6) // 7  # each item once, again after an HTML page


def test_an_outage_stops_the_run_and_is_not_cached_as_failed(chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.misbehaviour, chat_server.start_after = "error-500", 6  # six good answers, then down
    data = catalogue(tmp_path / "data", [f"Brand{n} Face Cream" for n in range(30)])
    began = time.monotonic()
    says = r"failed 8 requests in a row .*HTTP 500.*The 6 answers .* kept .*Fix: .*only for the 24 items still missing"
    with pytest.raises(BackendUnavailable, match=says):
        enrich_step(config(chat_server, batch_size=4, concurrency=2), data, data, tmp_path / "cache")
    assert time.monotonic() - began < 30 and chat_server.requests <= 6 + 8 + 2
    cache = EnrichCache(tmp_path / "cache")
    assert len(cache) == 6  # the good answers; no item cached as failed
    chat_server.misbehaviour = None  # the server is back: no --retry-failed needed
    summary = enrich_step(config(chat_server), data, data, tmp_path / "cache")
    assert (summary.asked, summary.cached, summary.ok, summary.failed) == (24, 6, 30, 0)


def test_a_closed_port_stops_the_run_with_its_fix(tmp_path: Path) -> None:
    data = catalogue(tmp_path / "data", [f"Brand{n} Face Cream" for n in range(20)])
    down = ChatServer(url=closed_port_url())
    began = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"ConnectError.*Fix: make it answer again"):
        enrich_step(config(down), data, data, tmp_path / "cache")
    assert time.monotonic() - began < 20  # not 10 requests x 30 s an item
    assert len(EnrichCache(tmp_path / "cache")) == 0


def test_a_refused_item_is_a_permanent_failure_and_cached(chat_server: ChatServer, tmp_path: Path) -> None:
    """The model's answer that never parses is the item's: cached as failed, as before (not asked again)."""
    data = catalogue(tmp_path / "data", ["Dusk hopeless Toner", "Acme Lip Balm"])
    summary = enrich_step(config(chat_server), data, data, tmp_path / "cache")
    assert (summary.ok, summary.failed, summary.left) == (1, 1, 0)
    rows = pl.read_parquet(data / "item_metadata.parquet")
    assert rows.filter(pl.col("status") == "failed")["problem"].str.contains("not JSON").all()


def test_requests_in_flight_when_the_schema_is_refused_are_asked_again_without_it(
    chat_server: ChatServer, tmp_path: Path
) -> None:
    """Not failed as the item's 400: the refusal is of the field, whichever request learns it first."""
    chat_server.accepts_schema, chat_server.delay_s = False, 0.0
    data = catalogue(tmp_path / "data", [f"Brand{n} Lip Balm" for n in range(4)])
    summary = enrich_step(config(chat_server, concurrency=4, batch_size=4), data, data, tmp_path / "cache")
    assert summary.ok == 4 and pl.read_parquet(data / "item_metadata.parquet")["attempts"].to_list() == [1] * 4
    assert chat_server.schemas_refused >= 1
