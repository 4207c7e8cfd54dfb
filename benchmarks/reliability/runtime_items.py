"""Run-time items through real `recsys serve` processes: kept files a server must refuse at start-up, adds that must
be refused with their reason, every id an add acknowledges looked up through every route (after hot swaps, rollbacks,
a restart and a kill -9), an add racing a swap, a large add under requests, and a disk that fills up or turns
read-only under the kept file.

The champion is a content-first model (it places items by their text) registered twice in a fresh store: v1 as
trained, v2 the same model whose catalogue holds RETRAINED (the bundle a retraining on that added item gives).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from urllib.parse import quote

import httpx

from benchmarks.reliability.api import ADMIN, TOKEN, Server, check, served
from benchmarks.reliability.cases import TRACEBACK, Case, Finished, run_recsys, short
from pipelines.registry import POINT, register_bundle
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.registry import CHAMPION, mlflow_module
from tests.serving.test_kept_items import remount, retrained_with, tmpfs

GROUP = "runtime items"
RETRAINED = "added-then-trained"
ADD, RELOAD = "/v1/admin/items", "/v1/admin/reload"


def runtime_item_cases(bundle: Bundle, id_only: tuple[str, str], work: Path) -> list[Case]:
    """`bundle`: a content-first champion's; `id_only`: (model name, tracking URI) of a model that cannot place
    items it never trained on."""
    work.mkdir(parents=True)
    name, uri = "reliability-runtime-items", f"sqlite:///{work / 'mlflow.db'}"
    for version in (bundle, retrained_with(bundle, RETRAINED, work / "bundle-v2")):
        register_bundle(version, name, uri, POINT)
    _champion(uri, name, "1")
    (work / "token").write_text(TOKEN)
    serve = _Serve(name, uri, work)
    return (
        _refused_at_start(serve, id_only, work / "refused")
        + _served(serve, work / "served")
        + _swaps_and_rollbacks(serve, work / "swaps")
        + _killed_and_restarted(serve, work / "killed")
        + _disk(serve, work / "disk")
    )


class _Serve:
    """`recsys serve` of the two-version champion with an admin token, run-time items kept in a given file."""

    def __init__(self, name: str, uri: str, work: Path) -> None:
        self.name, self.uri, self.work = name, uri, work

    def options(self, kept: Path, *more: str) -> list[str]:
        return ["--admin-token-file", str(self.work / "token"), "--added-items-file", str(kept),
                "--reload-min-interval-s", "0", *more]  # fmt: skip

    def running(self, kept: Path, *more: str) -> AbstractContextManager[Server]:
        return served(self.name, self.uri, self.work, *self.options(kept, *more))

    def refused(self, *options: str, model: tuple[str, str] | None = None) -> Finished:
        """`recsys serve OPTIONS` that must exit 2 before binding its port."""
        name, uri = model or (self.name, self.uri)
        return run_recsys("serve", "--port", "0", "--model-name", name, "--tracking-uri", uri, *options,
                          timeout_s=300)  # fmt: skip


def _champion(uri: str, name: str, version: str) -> None:
    mlflow_module().tracking.MlflowClient(uri).set_registered_model_alias(name, CHAMPION, version)


def _items(*ids: str, **fields: object) -> dict[str, object]:
    return {"items": [{"item_id": i, "title": f"a new lip balm {i}", **fields} for i in ids]}


def _case(name: str, sent: str, expected: str, outcome: str, ok: bool, message: str, *, lost: bool = False,
          server_error: bool = False, traceback: bool = False) -> Case:  # fmt: skip
    return Case(GROUP, name, sent, expected, outcome, ok, server_error, traceback, lost, short(message))


def _exit_2(name: str, sent: str, done: Finished, says: str) -> Case:
    last = done.output.strip().splitlines()[-1] if done.output.strip() else ""
    ok = done.exit_code == 2 and says in done.output and "Fix: " in done.output
    return _case(name, sent, f"exit 2 before binding, saying {says!r}", f"exit {done.exit_code}", ok, last,
                 traceback=TRACEBACK in done.output)  # fmt: skip


def _refused_at_start(serve: _Serve, id_only: tuple[str, str], root: Path) -> list[Case]:
    """Kept files, option values and models a server must refuse before it binds its port (exit 2, file and fix)."""
    root.mkdir()
    entries: list[tuple[str, object, str]] = [
        ("a null title", {"item_id": "a", "title": None}, "title is null"),
        ("an integer item_id", {"item_id": 7, "title": "x"}, "item_id is a number"),
        ("a list title", {"item_id": "a", "title": ["x"]}, "title is a list"),
        ("a blank title", {"item_id": "a", "title": " "}, "expected a text of 1-2000 characters"),
        ("an unknown key", {"item_id": "a", "title": "x", "price": 3}, "unknown keys ['price']"),
        ("a field name with a space", {"item_id": "a", "title": "x", "fields": {"Bad Name": "y"}}, "field name"),
        ("an entry that is not an object", "a", "expected an object"),
    ]
    cases = []
    for i, (name, entry, says) in enumerate(entries):
        kept = root / f"kept-{i}.json"
        kept.write_text(json.dumps({"version": 1, "items": [entry]}))
        cases.append(_exit_2(f"kept file: {name}", f"--added-items-file with {json.dumps(entry)[:80]}",
                             serve.refused(*serve.options(kept)), says))  # fmt: skip
    cut = root / "kept-cut.json"
    cut.write_text('{"version": 1, "items": [{"item_id": "a", "ti')
    cases.append(_exit_2("kept file: cut short", "--added-items-file cut mid-entry", serve.refused(*serve.options(cut)),
                         "not a file of run-time items"))  # fmt: skip
    three = root / "kept-three.json"
    three.write_text(json.dumps({"version": 1, "items": [{"item_id": f"n{i}", "title": f"new {i}"} for i in range(3)]}))
    cases.append(
        _exit_2(
            "--max-added-items below the kept file's count",
            "3 kept items, --max-added-items 2",
            serve.refused(*serve.options(three, "--max-added-items", "2")),
            "keeps 3 run-time items",
        )
    )
    cases.append(
        _exit_2(
            "kept items over an ID-only model",
            "3 kept items, a SASRec without a content encoder",
            serve.refused(*serve.options(three), model=id_only),
            "cannot place items it never trained on",
        )
    )
    (root / "no-keys").write_text("# every key revoked\n\n")
    cases.append(_exit_2("an API-keys file without a key", "--api-keys-file holding comments only",
                         serve.refused("--api-keys-file", str(root / "no-keys")), "holds no key"))  # fmt: skip
    return cases


def _served(serve: _Serve, root: Path) -> list[Case]:
    """One server: adds refused with their reason; an added id (`a/b` included) through every route; a 1,000-item add
    while recommendations are asked for; a body sent as a form (the README's first curl once did)."""
    root.mkdir()
    kept = root / "added.json"
    with serve.running(kept) as server:
        c = partial(check, server, GROUP)  # (name, expected status, what it says, method, path, **request)

        cases = [
            c("add: a null title", 422, "title", "POST", ADD, json={"items": [{"item_id": "x", "title": None}]},
              headers=ADMIN),
            c("add: an integer item_id", 422, "valid string", "POST", ADD, json={"items": [{"item_id": 7,
              "title": "x"}]}, headers=ADMIN),
            c("add: a list title", 422, "valid string", "POST", ADD, json={"items": [{"item_id": "x",
              "title": ["x"]}]}, headers=ADMIN),
            c("add: 1,001 items", 422, "at most 1000", "POST", ADD, json=_items(*[f"n{i}" for i in range(1001)]),
              headers=ADMIN),
            c("add: no items", 422, "at least 1", "POST", ADD, json={"items": []}, headers=ADMIN),
            c("add: a title of 2,001 characters", 422, "at most 2000", "POST", ADD,
              json={"items": [{"item_id": "x", "title": "t" * 2001}]}, headers=ADMIN),
            c("add: an item of the trained catalogue", 422, "in the trained catalogue", "POST", ADD,
              json=_items(_trained_item(server)), headers=ADMIN),
            c("add: without a token", 401, "authorization: bearer", "POST", ADD, json=_items("x")),
            c("add: sent as a form (curl -d)", 415, "Content-Type: application/json", "POST", ADD,
              content=json.dumps(_items("x")).encode(), headers={**ADMIN,
              "content-type": "application/x-www-form-urlencoded"}),
            c("add: an id with a slash", 200, '"added":1', "POST", ADD, json=_items("a/b"), headers=ADMIN),
            c("similar items of an added id with a slash (a%2Fb)", 200, '"item_id":"a/b"', "GET",
              "/v1/similar-items/a%2Fb"),
            c("similar items of an unknown 256-char id: no echo", 404, "unknown item", "GET",
              "/v1/similar-items/" + "u" * 256, max_bytes=1_000),
        ]  # fmt: skip
        cases += _every_route(server, "after its add", "a/b")
        cases.append(_large_add_under_requests(server))
    return cases


def _trained_item(server: Server) -> str:
    """An item of the served model's trained catalogue (the first a recommendation names)."""
    reply = httpx.post(f"{server.base}/v1/recommendations", json={"user_id": "nobody", "k": 1}, timeout=30)
    return str(reply.json()["items"][0]["item_id"])


def _every_route(server: Server, when: str, *ids: str) -> list[Case]:
    """Each id answers through similar items, recommendations (known history) and events (accepted): one case."""
    problems = []
    for item in ids:
        answers = {
            "similar items": httpx.get(f"{server.base}/v1/similar-items/{quote(item, safe='')}", timeout=30),
            "recommendations": httpx.post(f"{server.base}/v1/recommendations", json={"history": [item]}, timeout=30),
            "events": httpx.post(f"{server.base}/v1/events", json={"user_id": "kept", "item_ids": [item]}, timeout=30),
        }
        for route, answer in answers.items():
            body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
            known = answer.status_code == 200 and body.get("unknown_count", 0) == 0
            if not known or (route == "events" and body.get("accepted") != 1):
                problems.append(f"{item} via {route}: {answer.status_code} {answer.text[:120]}")
    return [_case(f"acknowledged ids through every route, {when}", f"ids {list(ids)}",
                  "200 and known on similar items, recommendations and events", "all known" if not problems else
                  f"{len(problems)} not", not problems, "; ".join(problems) or "all known",
                  lost=bool(problems))]  # fmt: skip


def _large_add_under_requests(server: Server) -> Case:
    """1,000 items added while a client asks for recommendations without pause: every request answered 200 (the
    add runs off the request path), the add acknowledged, and the items placed."""
    statuses: list[int] = []
    stop = threading.Event()

    def ask() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                statuses.append(client.post(f"{server.base}/v1/recommendations", json={"user_id": "u1"}).status_code)

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        added = httpx.post(f"{server.base}{ADD}", json=_items(*[f"bulk-{i}" for i in range(1000)]), headers=ADMIN,
                           timeout=600)  # fmt: skip
    finally:
        stop.set()
        asker.join(60)
    placed = httpx.get(f"{server.base}/v1/similar-items/bulk-999", timeout=30).status_code
    bad = [s for s in statuses if s != 200]
    ok = added.status_code == 200 and placed == 200 and not bad
    return _case("a 1,000-item add under requests", "POST /v1/admin/items of 1,000 items, recommendations meanwhile",
                 "the add 200, every request 200, the items placed",
                 f"add {added.status_code}, {len(statuses)} requests ({len(bad)} not 200), placed {placed}", ok,
                 added.text, server_error=any(s >= 500 for s in bad) or added.status_code >= 500)  # fmt: skip


def _swaps_and_rollbacks(serve: _Serve, root: Path) -> list[Case]:
    """Items added under v1 (one of them in v2's catalogue) answer after v2 is promoted, rolled back, promoted again;
    adds racing reloads of alternating versions are answered 200 or 422, never 500; the kept file drops nothing."""
    root.mkdir()
    kept = root / "added.json"
    _champion(serve.uri, serve.name, "1")
    with serve.running(kept) as server:
        added = httpx.post(f"{server.base}{ADD}", json=_items(RETRAINED, "only-added"), headers=ADMIN, timeout=300)
        cases = []
        for n, version in enumerate(("2", "1", "2", "1")):
            _champion(serve.uri, serve.name, version)
            reload = httpx.post(f"{server.base}{RELOAD}", headers=ADMIN, timeout=300)
            swapped = reload.status_code == 200 and reload.json().get("registry_version") == version
            step = f"{'promotion' if version == '2' else 'rollback'} {n // 2 + 1}"
            case = _every_route(server, f"after {step}", RETRAINED, "only-added")[0]
            cases.append(Case(**{**case.record(), "clear": case.clear and swapped and added.status_code == 200,
                                 "outcome": f"reload {reload.status_code} to v{version}; {case.outcome}"}))  # fmt: skip
        cases.append(_adds_racing_swaps(serve, server))
    held = [item["item_id"] for item in json.loads(kept.read_text())["items"]]
    cases.append(_case("the kept file after swaps, rollbacks and racing adds", str(kept.name),
                       f"holds {RETRAINED!r} and 'only-added'", str(held[:5]),
                       RETRAINED in held and "only-added" in held, f"{len(held)} items kept",
                       lost=not {RETRAINED, "only-added"} <= set(held)))  # fmt: skip
    _champion(serve.uri, serve.name, "1")
    return cases


def _adds_racing_swaps(serve: _Serve, server: Server, rounds: int = 10) -> Case:
    """Each round: the champion alias flips, a reload and an add of RETRAINED plus a new id go at once."""
    statuses: list[tuple[int, int]] = []
    with ThreadPoolExecutor(2) as pool:
        for n in range(rounds):
            _champion(serve.uri, serve.name, "2" if n % 2 == 0 else "1")
            reload = pool.submit(httpx.post, f"{server.base}{RELOAD}", headers=ADMIN, timeout=300)
            add = pool.submit(httpx.post, f"{server.base}{ADD}", json=_items(RETRAINED, f"race-{n}"), headers=ADMIN,
                              timeout=300)  # fmt: skip
            statuses.append((_status(reload), _status(add)))
    bad = [s for s in statuses if s[0] not in (200, 429) or s[1] not in (200, 422)]
    logged = TRACEBACK in server.log_text()
    return _case("adds racing hot swaps", f"{rounds} rounds: the alias flips, a reload and an add at once",
                 "reloads 200, adds 200 (placed) or 422 (in the catalogue swapped in), never 500",
                 f"(reload, add) statuses {sorted(set(statuses))}", not bad and not logged, str(bad[:3]),
                 server_error=any(500 in s or 0 in s for s in statuses), traceback=logged)  # fmt: skip


def _killed_and_restarted(serve: _Serve, root: Path) -> list[Case]:
    """Two items acknowledged, then kill -9 in the middle of a 1,000-item add; the restarted server serves the two
    (embedded from the cache, not again), cleared what the killed add left, and is ready within 30 s."""
    root.mkdir()
    kept = root / "added.json"
    with serve.running(kept) as server:
        first = httpx.post(f"{server.base}{ADD}", json=_items("k1", "k2"), headers=ADMIN, timeout=300)
        bulk = threading.Thread(
            target=_quietly(
                lambda: httpx.post(
                    f"{server.base}{ADD}",
                    json=_items(*[f"killed-{i}" for i in range(1000)]),
                    headers=ADMIN,
                    timeout=300,
                )
            )
        )
        bulk.start()
        time.sleep(1.0)
        os.kill(server.pid, signal.SIGKILL)
        bulk.join(60)
    began = time.monotonic()
    with serve.running(kept) as server:
        ready_s = time.monotonic() - began
        cases = _every_route(server, "after kill -9 mid-add and a restart", "k1", "k2")
        log = server.log_text()
    leftovers = [p.name for p in root.glob(".added.json.*")]
    reused = "2 from the cache, 0 embedded" in log
    cases.append(_case("restart after kill -9 mid-add", "kill -9 during a 1,000-item add, then recsys serve again",
                       "ready within 30 s, the kept vectors reused, no temp file left",
                       f"ready in {ready_s:.1f} s, leftovers {leftovers}", first.status_code == 200 and
                       ready_s < 30 and reused and not leftovers, short(log[-300:]),
                       lost=bool(leftovers), traceback=TRACEBACK in log))  # fmt: skip
    return cases


def _status(answer: Future[httpx.Response]) -> int:
    """The status of a request sent in the background; 0 when no answer came."""
    try:
        return answer.result().status_code
    except httpx.TransportError:
        return 0


def _quietly(send: Callable[[], object]) -> Callable[[], None]:
    """`send`, its connection error ignored (the server it talks to is killed on purpose)."""

    def run() -> None:
        with contextlib.suppress(httpx.TransportError):
            send()

    return run


def _disk(serve: _Serve, root: Path) -> list[Case]:
    """The kept file on a real 4 MiB tmpfs: full → 507 and /readyz degraded, read-only → 503, then writable → 200 and
    ok; a server started on it read-only exits 2. Nothing acknowledged is lost, nothing unacknowledged served."""
    root.mkdir()
    mounted = contextlib.ExitStack()
    try:
        disk = mounted.enter_context(tmpfs(root / "disk"))
    except OSError as err:  # not root: the cases count as failed, not skipped
        return [_case("kept file on a full / read-only disk", "a tmpfs", "mounted", "not mounted", False, str(err))]
    with mounted:
        return _on_disk(serve, disk)


def _on_disk(serve: _Serve, disk: Path) -> list[Case]:
    kept = disk / "added.json"
    cases = []
    with serve.running(kept) as server:
        c = partial(check, server, GROUP)  # (name, expected status, what it says, method, path, **request)

        cases.append(c("add on a disk with room", 200, '"added":1', "POST", ADD, json=_items("d1"), headers=ADMIN))
        before = kept.read_bytes()
        with (disk / "filler").open("wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError:
                pass
        cases.append(c("add on a full disk", 507, "Fix: free space", "POST", ADD, json=_items("d2"), headers=ADMIN))
        cases.append(c("readiness on a full disk", 200, '"status":"degraded"', "GET", "/readyz"))
        cases.append(c("an add refused for space is not served", 404, "unknown item", "GET", "/v1/similar-items/d2"))
        (disk / "filler").unlink()
        remount(disk, "ro")
        try:
            cases.append(c("add on a read-only disk", 503, "Fix: make its directory writable", "POST", ADD,
                           json=_items("d2"), headers=ADMIN))  # fmt: skip
        finally:
            remount(disk, "rw")
        cases.append(c("add once writable again", 200, '"added":1', "POST", ADD, json=_items("d2"), headers=ADMIN))
        cases.append(c("readiness once writable again", 200, '"status":"ok"', "GET", "/readyz"))
        rewritten = kept.read_bytes() != before  # the last add wrote it
    remount(disk, "ro")
    try:
        done = serve.refused(*serve.options(kept))
    finally:
        remount(disk, "rw")
    cases.append(_exit_2("start with the kept file on a read-only disk", "recsys serve --added-items-file <ro tmpfs>",
                         done, "is not writable"))  # fmt: skip
    held = [item["item_id"] for item in json.loads(kept.read_text())["items"]]
    cases.append(
        _case(
            "the kept file after a full and a read-only disk",
            kept.name,
            "holds d1 and d2",
            str(held),
            held == ["d1", "d2"] and rewritten,
            f"{len(held)} items",
            lost=held != ["d1", "d2"],
        )
    )
    return cases
