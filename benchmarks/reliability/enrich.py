"""`recsys enrich --backend http` as a real process against the tests' chat-completions server misbehaving in each
way a real server or the network does (tests/chat_server.py), a records file altered column by column, an outage, and
every input the user can get wrong: each run's exit code, its message, its time, and whether an answer the server gave
was lost (the cache must keep every good answer; an outage must leave nothing cached as failed).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl

from benchmarks.reliability.cases import TRACEBACK, Case, Finished, run_recsys, short
from recsys.enrich.cache import CACHE_FILE
from tests.chat_server import MISBEHAVIOURS, ChatServer, closed_port_url, serve_chat
from tests.cli.test_enrich import bad_inputs
from tests.recsys.enrich.test_records import CHANGES

GROUP = "enrich"
ITEMS = 40  # per catalogue: a `--limit 40` run, as the review's
RECORDS = "item_metadata.parquet"
DONE = f"{ITEMS} of {ITEMS} items with a record"
OUTAGE_SECONDS = 30.0  # an outage must stop the run this fast (it once cost ~30 s per item)


def enrich_cases(work: Path) -> list[Case]:
    work.mkdir(parents=True)
    return (
        _misbehaving_servers(work / "misbehaving")
        + _html_every_seventh(work / "html-every-7th")
        + _retry_after(work / "retry-after")
        + _outages(work / "outages")
        + _trickle(work / "trickle")
        + _records(work / "records")
        + _bad_inputs(work / "inputs")
    )


def _catalogue(folder: Path, items: int = ITEMS) -> Path:
    folder.mkdir(parents=True)
    pl.DataFrame({
        "item_idx": list(range(1, items + 1)),
        "item_id": [f"i{n}" for n in range(items)],
        "title": [f"Brand{n} Lip Balm Stick" for n in range(items)],
    }).write_parquet(folder / "items.parquet")  # fmt: skip
    return folder


def _enrich(data: Path, url: str, cache: Path, *options: str) -> Finished:
    return run_recsys("enrich", "--data-dir", str(data), "--backend", "http", "--url", url, "--model", "m",
                      "--cache-dir", str(cache), *options)  # fmt: skip


def _cached(cache: Path, status: str) -> int:
    """Answers of `status` (ok, failed) in the enrich cache under `cache` (0 without a cache)."""
    if not (cache / CACHE_FILE).is_file():
        return 0
    with sqlite3.connect(cache / CACHE_FILE) as db:
        return int(db.execute("SELECT count(*) FROM answers WHERE status = ?", (status,)).fetchone()[0])


def _case(name: str, sent: str, expected: str, done: Finished, ok: bool, *, lost: bool = False) -> Case:
    return Case(
        group=GROUP,
        name=name,
        input=sent,
        expected=expected,
        outcome=f"exit {done.exit_code} after {done.seconds:.1f} s",
        clear=ok,
        server_error=False,
        traceback=TRACEBACK in done.output,
        data_lost=lost,
        message=short(done.output.strip().splitlines()[-1] if done.output.strip() else ""),
    )


def _misbehaving_servers(root: Path) -> list[Case]:
    """Every 7th request answered by a misbehaviour, `--limit 40`: the bad answers are retried, never used, and the
    run ends with every item's record (a 401 is not retried: its item is left for the next run)."""
    cases = []
    for how, what in MISBEHAVIOURS.items():
        data, cache = _catalogue(root / how / "data"), root / how / "cache"
        with serve_chat(ChatServer(misbehaviour=how, every=7, trickle_s=0.2)) as server:
            done = _enrich(data, server.url, cache, "--limit", str(ITEMS), "--timeout-s", "2")
        refused = how == "unauthorized"
        expected = "exit 0, 0 failed, the refused items left for the next run" if refused else f"exit 0, {DONE}"
        ok = done.exit_code == 0 and "(0 failed," in done.output and (refused or DONE in done.output)
        cases.append(_case(f"enrich: every 7th answer {how}", f"a server whose every 7th answer is {what}",
                           expected, done, ok, lost=_cached(cache, "ok") != _answered(data)))  # fmt: skip
    return cases


def _answered(data: Path) -> int:
    """Items with a record in the records file written into `data` (0 when none was written)."""
    path = data / RECORDS
    return pl.read_parquet(path).filter(pl.col("status") == "ok").height if path.is_file() else 0


def _html_every_seventh(root: Path) -> list[Case]:
    """The review's case: an HTML page on every 7th request, three `--limit 40` runs over 120 items: each run adds
    its 40 records and the cache keeps them all (the review's three runs crashed and kept none)."""
    data, cache = _catalogue(root / "data", 3 * ITEMS), root / "cache"
    runs = []
    with serve_chat(ChatServer(misbehaviour="html", every=7)) as server:
        for _ in range(3):
            runs.append(_enrich(data, server.url, cache, "--limit", str(ITEMS)))
    kept = _cached(cache, "ok")
    last = runs[-1]
    total = Finished(max(r.exit_code for r in runs), last.output, sum(r.seconds for r in runs))
    return [_case("enrich: three --limit 40 runs, HTML every 7th", "3 runs of 40 items of 120, HTML every 7th",
                  "exit 0 each, the cache keeps 120 answers", total,
                  all(r.exit_code == 0 for r in runs) and kept == 3 * ITEMS, lost=kept < 3 * ITEMS)]  # fmt: skip


def _retry_after(root: Path) -> list[Case]:
    """A 429 (the first request's) with a Retry-After that is negative, not a number, or 10^12 seconds: the
    back-off applies, or the wait is capped at the longest (60 s), and every item gets its record."""
    cases = []
    for value in ("-1", "nan", "1e12"):
        data, cache = _catalogue(root / value / "data", 4), root / value / "cache"
        with serve_chat(ChatServer(misbehaviour="rate-limited", every=8, retry_after=value)) as server:
            done = _enrich(data, server.url, cache)
        ok = done.exit_code == 0 and "4 of 4 items with a record" in done.output and done.seconds < 90
        cases.append(_case(f"enrich: 429 with Retry-After {value}", f"4 items, a 429 (Retry-After: {value}) first",
                           "exit 0 within 90 s, 4 of 4 items with a record", done, ok))  # fmt: skip
    return cases


def _outages(root: Path) -> list[Case]:
    """A server answering 500 to everything, and a closed port: the run stops after its failures in a row (exit 2,
    saying how to go on), caches no item as failed, and the same command against a working server asks them all."""
    cases = []
    for name in ("a 500 on every request", "a closed port"):
        data, cache = _catalogue(root / name.replace(" ", "-") / "data"), root / name.replace(" ", "-") / "cache"
        with serve_chat(ChatServer(misbehaviour="error-500")) as down:
            done = _enrich(data, down.url if name.startswith("a 500") else closed_port_url(), cache)
        failed = _cached(cache, "failed")
        with serve_chat() as up:
            again = _enrich(data, up.url, cache)
        ok = done.exit_code == 2 and "run the same command again" in done.output and done.seconds < OUTAGE_SECONDS
        ok = ok and failed == 0 and DONE in again.output
        cases.append(_case(f"enrich: an outage ({name})", f"{ITEMS} items against {name}, then a working server",
                           f"exit 2 within {OUTAGE_SECONDS:.0f} s, nothing cached as failed; then {DONE}", done, ok,
                           lost=failed > 0))  # fmt: skip
    return cases


def _trickle(root: Path) -> list[Case]:
    """Every 3rd answer sent a byte a second, `--timeout-s 1`: each such request is cut at one second in all (the
    timeout once bounded each read: 27 s at timeout 3) and asked again."""
    data, cache = _catalogue(root / "data", 6), root / "cache"
    with serve_chat(ChatServer(misbehaviour="trickle", every=3, trickle_s=1.0)) as server:
        done = _enrich(data, server.url, cache, "--timeout-s", "1")
    ok = done.exit_code == 0 and "6 of 6 items with a record" in done.output and done.seconds < 30
    return [_case("enrich: a byte a second, --timeout-s 1", "6 items, every 3rd answer trickled a byte a second",
                  "exit 0 within 30 s, 6 of 6 items with a record", done, ok)]  # fmt: skip


def _records(root: Path) -> list[Case]:
    """A records file made by a real run, then altered one way per case and given with `--records`: refused whole
    (exit 2 naming the column or row), nothing of it cached, and a later run on that cache is fine."""
    data = _catalogue(root / "data", 3)
    with serve_chat() as server:
        made = _enrich(data, server.url, root / "made-cache")
        assert made.exit_code == 0, made.output
        good = pl.read_parquet(data / RECORDS)
        (data / RECORDS).unlink()
        cases = []
        for name, (alter, says) in CHANGES.items():
            folder = root / name.replace(" ", "-").replace(",", "")
            folder.mkdir()
            records, cache = folder / "records.parquet", folder / "cache"
            alter(good).write_parquet(records)
            done = _enrich(data, server.url, cache, "--records", str(records))
            taken = _cached(cache, "ok") + _cached(cache, "failed")
            later = _enrich(data, server.url, cache)
            ok = done.exit_code == 2 and says in done.output and "Fix: " in done.output and taken == 0
            ok = ok and "3 of 3 items with a record" in later.output
            cases.append(_case(f"enrich --records: {name}", f"--records with {name}", f"exit 2 saying {says!r}, "
                               "nothing cached, a later run fine", done, ok, lost=later.exit_code != 0))  # fmt: skip
            (data / RECORDS).unlink(missing_ok=True)
    return cases


def _bad_inputs(root: Path) -> list[Case]:
    """Each input the user can get wrong (tests/cli/test_enrich.py's table): exit 2 and its fix, before anything is
    asked of the server (a closed port: a request would fail differently)."""
    root.mkdir(parents=True)
    cases = []
    for name, options, says in bad_inputs(root):
        done = run_recsys("enrich", "--backend", "http", "--url", closed_port_url(), "--model", "m", "--cache-dir",
                          str(root / "cache"), *options)  # fmt: skip
        usage = name == "--threads 0"  # the option parser's own check: its usage message
        ok = done.exit_code == 2 and says in done.output and ("Fix: " in done.output or usage)
        cases.append(_case(f"enrich input: {name}", " ".join(options)[:200], f"exit 2 saying {says!r}", done, ok))
    return cases
