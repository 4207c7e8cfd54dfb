"""Hostile requests against real `recsys serve` processes: each case's status, message, and the server's log.

The same requests go to a server with the in-process history store and to one with Redis (both with an admin token);
then a server without a token (its admin routes must not exist), a broken champion, Redis down, a flood of new users
against a bounded store, and schemathesis with the token.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import wait_until_ok
from benchmarks.reliability.cases import RECSYS, TRACEBACK, Case, short

TOKEN = "reliability-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}
REDIS_URL = "redis://127.0.0.1:6379/12"
DOWN_URL = "redis://127.0.0.1:1/0"  # nothing listens there


@dataclass
class Server:
    base: str
    log: Path
    pid: int

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


@contextmanager
def served(name: str, uri: str, work: Path, *options: str) -> Iterator[Server]:
    """`recsys serve` of the registered champion, with an admin token and an adapter root, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = Path(tempfile.mkstemp(prefix="serve-", suffix=".log", dir=work)[1])
    (work / "adapters").mkdir(exist_ok=True)
    command = [RECSYS, "serve", "--model-name", name, "--tracking-uri", uri, "--port", str(port),
               "--adapter-root", str(work / "adapters"), "--reload-interval-s", "0", *options]  # fmt: skip
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_ok(f"{base}/healthz", 120, alive=lambda: server.poll() is None):
            raise SystemExit(f"recsys serve did not start: {log.read_text()[-2000:]}")
        yield Server(base, log, server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def check(
    server: Server,
    group: str,
    name: str,
    expected: int,
    says: str,
    method: str,
    path: str,
    max_bytes: int | None = None,
    **request: Any,
) -> Case:
    """Send one request; the case is clear when the status is `expected`, the body contains `says` and (with
    `max_bytes`) is no longer than that: an answer never echoes a large input."""
    log_start = len(server.log_text())
    sent = request.get("json", request.get("content", ""))
    described = f"{method} {path} {short(str(sent) if not isinstance(sent, bytes) else repr(sent[:120]), 160)}"
    try:
        response = httpx.request(method, f"{server.base}{path}", timeout=30, **request)
        status, body = response.status_code, response.text
    except httpx.TransportError as err:
        status, body = None, f"no answer: {err}"
    logged = server.log_text()[log_start:]
    return Case(
        group=group,
        name=name,
        input=described,
        expected=f"{expected} saying {says!r}",
        outcome=str(status),
        clear=status == expected and says.lower() in body.lower() and (max_bytes is None or len(body) <= max_bytes),
        server_error=status is None or status == 500 or (status >= 500 and status != expected),
        traceback=TRACEBACK in logged or TRACEBACK in body,
        data_lost=False,
        message=short(body),
    )


def hostile_requests(server: Server, group: str, item_ids: list[str], user_id: str) -> list[Case]:
    """The hostile (and a few ordinary) requests every server gets: recommendations, events, similar items, admin."""
    item, long_id, deep = item_ids[0], "i" * 257, b"[" * 100_000 + b"]" * 100_000

    def c(name: str, expected: int, says: str, method: str, path: str, **request: Any) -> Case:
        return check(server, group, name, expected, says, method, path, **request)

    unknown = [f"{i:0>256}" for i in range(1000)]  # 1,000 ids of 256 characters: ~260 kB

    rec, events = "/v1/recommendations", "/v1/events"
    return [
        c("known user", 200, '"source":"model"', "POST", rec, json={"user_id": user_id}),
        c("unknown user: popularity", 200, '"source":"popularity"', "POST", rec, json={"user_id": "nobody"}),
        c("k = 0", 422, "greater than or equal to 1", "POST", rec, json={"user_id": user_id, "k": 0}),
        c("k = 101", 422, "less than or equal to 100", "POST", rec, json={"user_id": user_id, "k": 101}),
        c("k a string", 422, "valid integer", "POST", rec, json={"user_id": user_id, "k": "ten"}),
        c("k true: not a number", 422, "valid integer", "POST", rec, json={"user_id": user_id, "k": True}),
        c("k '10': a string is not a number", 422, "valid integer", "POST", rec, json={"user_id": user_id, "k": "10"}),
        c(
            "1,000 unknown history ids: counted, 20 named",
            200,
            '"unknown_count":1000',
            "POST",
            rec,
            max_bytes=10_000,
            json={"history": unknown},
        ),
        c("k = 1e400", 422, "k", "POST", rec, content=b'{"user_id": "u", "k": 1e400}', headers=JSON),
        c("user_id and history", 422, "exactly one", "POST", rec, json={"user_id": user_id, "history": [item]}),
        c("neither user_id nor history", 422, "exactly one", "POST", rec, json={}),
        c("unknown field", 422, "extra inputs", "POST", rec, json={"user_id": user_id, "colour": "red"}),
        c("history not a list", 422, "valid list", "POST", rec, json={"history": item}),
        c("history of 1,001 ids", 422, "at most 1000", "POST", rec, json={"history": [item] * 1001}),
        c("history id of 257 chars", 422, "at most 256", "POST", rec, json={"history": [long_id]}),
        c("empty user_id", 422, "at least 1", "POST", rec, json={"user_id": ""}),
        c("user_id of 257 chars", 422, "at most 256", "POST", rec, json={"user_id": "u" * 257}),
        c("user_id of 100 kB: no echo", 422, "at most 256", "POST", rec, json={"user_id": "u" * 100_000}),
        c("body of 2 MB", 413, "larger than", "POST", rec, json={"history": ["i" * 200] * 10_000}),
        c(
            "chunked body of 2 MB",
            413,
            "larger than",
            "POST",
            rec,
            content=iter([b"[" + b"1," * 1024] * 1024),
            headers=JSON,
        ),
        c("lone surrogate user_id", 400, "valid unicode", "POST", rec, content=b'{"user_id": "\\ud800"}', headers=JSON),
        c(
            "lone surrogate in history",
            400,
            "valid unicode",
            "POST",
            rec,
            content=b'{"history": ["\\udfff"]}',
            headers=JSON,
        ),
        c("malformed JSON", 400, "not valid JSON", "POST", rec, content=b'{"user_id": ', headers=JSON),
        c("JSON nested 100,000 deep", 400, "not valid JSON", "POST", rec, content=deep, headers=JSON),
        c("empty body", 422, "field required", "POST", rec, content=b"", headers=JSON),
        c("a JSON list body", 422, "valid dictionary", "POST", rec, json=[1, 2]),
        c(
            "text/plain body",
            415,
            "Content-Type: application/json",
            "POST",
            rec,
            content=b'{"user_id": "u"}',
            headers={"content-type": "text/plain"},
        ),
        c(
            "timestamps with user_id",
            422,
            "go with an explicit history",
            "POST",
            rec,
            json={"user_id": user_id, "timestamps": [1]},
        ),
        c(
            "timestamps of another length",
            422,
            "give one per item",
            "POST",
            rec,
            json={"history": [item, item], "timestamps": [1]},
        ),
        c(
            "negative timestamp",
            422,
            "greater than or equal to 0",
            "POST",
            rec,
            json={"history": [item], "timestamps": [-1]},
        ),
        c("timestamp 2^63", 422, "less than or equal to", "POST", rec, json={"history": [item], "timestamps": [2**63]}),
        c(
            "domain on a single-domain bundle",
            422,
            "single domain",
            "POST",
            rec,
            json={"user_id": user_id, "domain": "x"},
        ),
        c("domain of 65 chars", 422, "at most 64", "POST", rec, json={"user_id": user_id, "domain": "d" * 65}),
        c(
            "exclude_seen not a bool",
            422,
            "valid boolean",
            "POST",
            rec,
            json={"user_id": user_id, "exclude_seen": "maybe"},
        ),
        c(
            "unknown history ids listed",
            200,
            '"unknown_items":["no-such-item"]',
            "POST",
            rec,
            json={"history": [item, "no-such-item"]},
        ),
        c("NUL in user_id", 200, '"source":"popularity"', "POST", rec, json={"user_id": "a\x00b"}),
        c("events", 200, '"accepted":1', "POST", events, json={"user_id": "reliability", "item_ids": [item]}),
        c(
            "events of unknown items",
            200,
            '"unknown_items":["nope"]',
            "POST",
            events,
            json={"user_id": "reliability", "item_ids": ["nope"]},
        ),
        c("events without items", 422, "at least 1", "POST", events, json={"user_id": "u", "item_ids": []}),
        c("events of 101 items", 422, "at most 100", "POST", events, json={"user_id": "u", "item_ids": [item] * 101}),
        c("event id of 1 MB", 413, "larger than", "POST", events, json={"user_id": "u", "item_ids": ["i" * 1_100_000]}),
        c("event id of 257 chars", 422, "at most 256", "POST", events, json={"user_id": "u", "item_ids": [long_id]}),
        c(
            "events: lone surrogate user",
            400,
            "valid unicode",
            "POST",
            events,
            content=b'{"user_id": "\\ud800", "item_ids": ["a"]}',
            headers=JSON,
        ),
        c(
            "events: timestamps of another length",
            422,
            "give one per item",
            "POST",
            events,
            json={"user_id": "u", "item_ids": [item], "timestamps": [1, 2]},
        ),
        c(
            "events: timestamp 2^63",
            422,
            "less than or equal to",
            "POST",
            events,
            json={"user_id": "u", "item_ids": [item], "timestamps": [2**63]},
        ),
        c("events without user_id", 422, "field required", "POST", events, json={"item_ids": [item]}),
        c("events: malformed JSON", 400, "not valid JSON", "POST", events, content=b"{]", headers=JSON),
        c("similar items", 200, '"items":[', "GET", f"/v1/similar-items/{item}"),
        c("similar items of an unknown item", 404, "unknown item", "GET", "/v1/similar-items/no-such-item"),
        c("similar items k = 0", 422, "greater than or equal to 1", "GET", f"/v1/similar-items/{item}?k=0"),
        c("similar items k = 1000", 422, "less than or equal to 100", "GET", f"/v1/similar-items/{item}?k=1000"),
        c("similar items: path traversal", 404, "not found", "GET", "/v1/similar-items/..%2F..%2Fetc%2Fpasswd"),
        c(
            "similar items: id of 65,000 chars: no echo",
            422,
            "at most 256",
            "GET",
            "/v1/similar-items/" + "x" * 65_000,
            max_bytes=2_000,
        ),
        c("similar items: encoded surrogate", 404, "unknown item", "GET", "/v1/similar-items/%ED%A0%80"),
        c("reload without a token", 401, "authorization: bearer", "POST", "/v1/admin/reload"),
        c(
            "reload with a wrong token",
            403,
            "wrong admin token",
            "POST",
            "/v1/admin/reload",
            headers={"Authorization": "Bearer " + "x" * 40},
        ),
        c(
            "reload with the token in the query",
            401,
            "authorization: bearer",
            "POST",
            f"/v1/admin/reload?token={TOKEN}",
        ),
        c("reload with the token", 200, '"reloaded":false', "POST", "/v1/admin/reload", headers=ADMIN),
        c("reload again at once", 429, "retry in", "POST", "/v1/admin/reload", headers=ADMIN),
        c(
            "adapter without a token",
            401,
            "authorization: bearer",
            "POST",
            "/v1/admin/adapters/sports",
            json={"version": "v1"},
        ),
        c(
            "adapter: a path for a version",
            422,
            "version",
            "POST",
            "/v1/admin/adapters/sports",
            json={"version": "../../../etc/passwd"},
            headers=ADMIN,
        ),
        c(
            "adapter: an absolute path",
            422,
            "version",
            "POST",
            "/v1/admin/adapters/sports",
            json={"version": "/etc/passwd"},
            headers=ADMIN,
        ),
        c(
            "adapter: the old `path` field",
            422,
            "extra inputs",
            "POST",
            "/v1/admin/adapters/sports",
            json={"path": "/root/.bashrc", "version": "v1"},
            headers=ADMIN,
        ),
        c(
            "adapter: traversal in the domain",
            404,
            "not found",
            "POST",
            "/v1/admin/adapters/..%2F..%2Fetc",
            json={"version": "v1"},
            headers=ADMIN,
        ),
        c(
            "adapter on a single-domain bundle",
            409,
            "no domain adapters",
            "POST",
            "/v1/admin/adapters/sports",
            json={"version": "v1"},
            headers=ADMIN,
        ),
        *_not_json(
            c,
            {
                "events": events,
                "search": "/v1/search",
                "adapters": "/v1/admin/adapters/sports",
                "admin items": "/v1/admin/items",
            },
        ),
        c(
            "recommendations sent as a form (curl -d)",
            415,
            "Content-Type: application/json",
            "POST",
            rec,
            content=b'{"user_id": "u"}',
            headers={"content-type": "application/x-www-form-urlencoded"},
        ),
        c(
            "recommendations without a content type",
            415,
            "this request's content type: none",
            "POST",
            rec,
            content=b'{"user_id": "u"}',
        ),
        docs_offline(server, group),
        c("wrong method", 405, "method not allowed", "GET", rec),
        c("unknown route", 404, "not found", "GET", "/v1/nothing-here"),
        c("readiness", 200, '"status":"ok"', "GET", "/readyz"),
        c("metrics", 200, "recsys_history_store_up 1.0", "GET", "/metrics"),
    ]


def _not_json(c: Callable[..., Case], routes: dict[str, str]) -> list[Case]:
    """Each other route taking a JSON body, sent one as `text/plain`: a 415 naming the header to send (before any
    token or body check: the admin ones are sent with the token)."""
    return [
        c(
            f"{name}: text/plain body",
            415,
            "Content-Type: application/json",
            "POST",
            path,
            content=b"{}",
            headers={"content-type": "text/plain", **ADMIN},
        )
        for name, path in routes.items()
    ]


def docs_offline(server: Server, group: str) -> Case:
    """/docs loads every script and stylesheet from this server (without internet a CDN's would leave it blank)."""
    page = httpx.get(f"{server.base}/docs", timeout=30)
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    answers = {source: httpx.get(server.base + source, timeout=30).status_code for source in sources
               if source.startswith("/")}  # fmt: skip
    elsewhere = [source for source in sources if not source.startswith("/")]
    ok = page.status_code == 200 and bool(sources) and not elsewhere and set(answers.values()) == {200}
    return Case(
        group,
        "/docs without internet: every asset from this server",
        "GET /docs, then each asset",
        "200, every src/href a path of this server answering 200",
        f"{page.status_code}, assets {answers}",
        ok,
        False,
        False,
        False,
        short(f"elsewhere: {elsewhere}" if elsewhere else str(sorted(answers))),
    )


def flood_of_new_users(server: Server, group: str, item: str, users: int, max_users: int) -> Case:
    """Events for `users` new users against a store bounded to `max_users`: memory must not grow with them."""
    before = server.rss_mb()
    statuses = set()
    with httpx.Client(base_url=server.base, timeout=30) as http:
        for i in range(users):
            statuses.add(http.post("/v1/events", json={"user_id": f"flood-{i}", "item_ids": [item]}).status_code)
    grown = server.rss_mb() - before
    bounded = grown < 30  # a user costs ~7 kB unbounded: 5,000 users would be ~35 MB; bounded, the store holds 1,000
    return Case(
        group, "a flood of new users", f"POST /v1/events for {users} new users, RECSYS_MAX_USERS={max_users}",
        "200s, resident memory growing < 30 MB", f"statuses {sorted(statuses)}, +{grown:.1f} MB",
        clear=statuses == {200} and bounded, server_error=500 in statuses, traceback=TRACEBACK in server.log_text(),
        data_lost=False, message=f"resident memory {before:.0f} -> {before + grown:.0f} MB",
    )  # fmt: skip


def broken_champion(server: Server, reloads: int) -> list[Case]:
    """After a champion whose weights cannot be read was registered: reloads, readiness, metrics, the log."""
    group = "api: broken champion"
    first = check(server, group, "reload of a broken champion", 503, "cannot be loaded", "POST", "/v1/admin/reload",
                  headers=ADMIN)  # fmt: skip
    log_start = len(server.log_text())
    statuses = []
    for _ in range(reloads):  # as fast as the limit allows: the rest are 429s
        statuses.append(httpx.post(f"{server.base}/v1/admin/reload", headers=ADMIN, timeout=30).status_code)
    lines = server.log_text()[log_start:].count("\n")
    flood = Case(
        group, "reload flood", f"{reloads} admin reloads in a row", "429s, no 5xx but 503, < 5 log lines",
        f"statuses {sorted(set(statuses))}, {lines} log lines", clear=lines < 5 and set(statuses) <= {429, 503},
        server_error=500 in statuses, traceback=TRACEBACK in server.log_text(), data_lost=False,
        message=f"{lines} log lines for {reloads} reloads",
    )  # fmt: skip
    ready = check(server, group, "readiness names the broken champion", 200, "cannot be loaded", "GET", "/readyz")
    serving = check(server, group, "the previous model keeps serving", 200, '"source":"model"', "POST",
                    "/v1/recommendations", json={"user_id": "u00001"})  # fmt: skip
    failures = _metric(server, "recsys_model_reload_failures_total")
    counted = Case(
        group, "failed reloads counted", "GET /metrics", "recsys_model_reload_failures_total = the 503s",
        f"{failures:g}", clear=failures == 1 + statuses.count(503), server_error=False, traceback=False,
        data_lost=False, message=f"recsys_model_reload_failures_total {failures:g}",
    )  # fmt: skip
    return [first, flood, ready, serving, counted]


def _metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.base}/metrics", timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def redis_down(server: Server, item: str) -> list[Case]:
    group = "api: redis down"
    log_start = len(server.log_text())
    cases = [
        check(server, group, "recommendations while Redis is down", 200, '"degraded":true', "POST",
              "/v1/recommendations", json={"user_id": "u00001"}),
        check(server, group, "events while Redis is down", 503, "retry later", "POST", "/v1/events",
              json={"user_id": "u00001", "item_ids": [item]}),
        check(server, group, "readiness while Redis is down", 200, '"status":"degraded"', "GET", "/readyz"),
        check(server, group, "metrics while Redis is down", 200, "recsys_history_store_up 0.0", "GET", "/metrics"),
    ]  # fmt: skip
    with httpx.Client(base_url=server.base, timeout=30) as http:
        for _ in range(200):
            http.post("/v1/recommendations", json={"user_id": "u00001"})
    log = server.log_text()
    warned = log.count("is down")
    cases.append(Case(
        group, "one warning, not one per request", "200 recommendations while Redis is down",
        "the outage logged once (at start-up)", f"{warned} 'is down' lines, {log[log_start:].count(chr(10))} new lines",
        clear=warned == 1, server_error=False, traceback=TRACEBACK in log, data_lost=False,
        message=short(next((line for line in log.splitlines() if "is down" in line), "")),
    ))  # fmt: skip
    return cases


def no_admin_token(server: Server) -> list[Case]:
    group = "api: no admin token"
    startup = server.log_text()
    return [
        check(
            server, group, "reload without admin routes", 404, "not found", "POST", "/v1/admin/reload", headers=ADMIN
        ),
        check(
            server,
            group,
            "adapter without admin routes",
            404,
            "not found",
            "POST",
            "/v1/admin/adapters/sports",
            json={"path": "/etc/passwd"},
        ),
        Case(
            group,
            "start-up says the admin routes are off",
            "recsys serve without RECSYS_ADMIN_TOKEN",
            "a log line naming RECSYS_ADMIN_TOKEN",
            "logged" if "RECSYS_ADMIN_TOKEN" in startup else "silent",
            clear="admin routes off" in startup,
            server_error=False,
            traceback=TRACEBACK in startup,
            data_lost=False,
            message=short(next((line for line in startup.splitlines() if "admin routes off" in line), "")),
        ),
    ]


def schemathesis(server: Server, examples: int, work: Path) -> dict[str, Any]:
    """schemathesis against the server with the admin token: generated requests, failures (server errors and schema
    violations)."""
    import sys

    binary = str(Path(sys.executable).with_name("schemathesis"))
    run = subprocess.run(
        [binary, "run", f"{server.base}/openapi.json", "--header", f"Authorization: Bearer {TOKEN}",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
         "--phases", "examples,coverage,fuzzing", "--max-examples", str(examples), "--seed", "0", "--workers", "1"],
        capture_output=True, text=True, timeout=900, cwd=work,
    )  # fmt: skip
    generated = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    failed = re.search(r"(\d+) failed", run.stdout.split("SUMMARY")[-1])
    return {
        "command": f"schemathesis run /openapi.json --header 'Authorization: Bearer ...' --max-examples {examples} "
        "--seed 0 --checks not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_schema_conformance",
        "exit_code": run.returncode,
        "generated": int(generated.group(1)) if generated else None,
        "failures": int(failed.group(1)) if failed else 0,
        "no_issues_found": "No issues found" in run.stdout,
        "tail": short(run.stdout[-600:], 600),
    }
