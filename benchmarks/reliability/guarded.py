"""The second review's API cases: what an API key guards (and that it is asked for first), the dashboard under
anonymous and keyed load, and adapter files that are symlink loops, of the wrong model, or swapped in twice."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks.common import REPO
from benchmarks.reliability.api import ADMIN, JSON, Server, check
from benchmarks.reliability.cases import Case

KEY = "reliability-api-key-0123456789"
KEYED = {"X-API-Key": KEY}
LOADED_P50_BOUND = 1.5  # a keyed client's p50 under the dashboard's load, over its p50 alone


def keyed_routes(server: Server, user_id: str) -> list[Case]:
    """A server with API keys: everything but the probes and the metrics needs one, and it is asked for first."""
    group = "api: API keys"

    def c(name: str, expected: int, says: str, method: str, path: str, **request: Any) -> Case:
        return check(server, group, name, expected, says, method, path, **request)

    rec = "/v1/recommendations"
    page = httpx.get(f"{server.base}/dashboard", headers=KEYED, timeout=120)
    etag = page.headers.get("etag", "")
    return [
        c("anonymous dashboard", 401, "needs an API key", "GET", "/dashboard"),
        c("anonymous /docs", 401, "needs an API key", "GET", "/docs"),
        c("anonymous /openapi.json", 401, "needs an API key", "GET", "/openapi.json"),
        c("anonymous malformed body: 401 before 400", 401, "needs an API key", "POST", rec, content=b"{", headers=JSON),
        c("a wrong key", 403, "not a key of this server", "POST", rec, json={"user_id": user_id},
          headers={"X-API-Key": "guess"}),
        c("keyed recommendations", 200, '"source":"model"', "POST", rec, json={"user_id": user_id}, headers=KEYED),
        c("keyed dashboard, plotly.js apart", 200, "/dashboard/plotly-", "GET", "/dashboard", max_bytes=1_000_000,
          headers=KEYED),
        c("keyed dashboard again: 304", 304, "", "GET", "/dashboard", headers={**KEYED, "If-None-Match": etag}),
        c("readiness without a key", 200, "\"status\":\"ok\"", "GET", "/readyz"),
    ]  # fmt: skip


def dashboard_under_load(server: Server, user_id: str, seconds: float) -> tuple[Case, dict[str, Any]]:
    """A keyed client's recommendations alone, then beside four anonymous dashboard readers (the case: its p50 within
    `LOADED_P50_BOUND` of its p50 alone), then beside four keyed ones reading the cached page as fast as they can
    (recorded, not bounded: a key holder flooding the server is the proxy's per-key rate limit to stop)."""
    alone = _latencies(server, user_id, seconds)
    anonymous = _under(server, user_id, seconds, {})
    keyed = _under(server, user_id, seconds, KEYED)
    runs = {"alone": alone, "anonymous_dashboard_load": anonymous[0], "keyed_dashboard_load": keyed[0]}
    p50 = {name: statistics.median(values) * 1000 for name, values in runs.items()}
    ratio = {name: round(p50[f"{name}_dashboard_load"] / p50["alone"], 2) for name in ("anonymous", "keyed")}
    record = {
        "seconds": seconds,
        "keyed_client_p50_ms": {k: round(v, 2) for k, v in p50.items()},
        "keyed_client_requests_per_s": {name: round(len(values) / seconds, 1) for name, values in runs.items()},
        "dashboard_requests": {"anonymous": anonymous[1], "keyed": keyed[1]},
        "anonymous_p50_ratio": ratio["anonymous"],
        "keyed_p50_ratio": ratio["keyed"],
        "bound": LOADED_P50_BOUND,
    }
    case = Case(
        "api: API keys", "a keyed client beside anonymous dashboard readers",
        f"4 anonymous /dashboard readers for {seconds:g} s", f"p50 within {LOADED_P50_BOUND}x of its p50 alone",
        f"{ratio['anonymous']:.2f}x", ratio["anonymous"] <= LOADED_P50_BOUND, False, False, False,
        f"p50 {p50['alone']:.1f} ms alone, {p50['anonymous_dashboard_load']:.1f} ms beside anonymous readers "
        f"({anonymous[1]} requests); {p50['keyed_dashboard_load']:.1f} ms beside keyed ones ({keyed[1]} requests)",
    )  # fmt: skip
    return case, record


def _latencies(server: Server, user_id: str, seconds: float) -> list[float]:
    """The seconds of each keyed recommendation request, one after another, for `seconds`."""
    out = []
    with httpx.Client(base_url=server.base, headers=KEYED, timeout=30) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            client.post("/v1/recommendations", json={"user_id": user_id, "k": 10}).raise_for_status()
            out.append(time.perf_counter() - start)
    return out


def _under(server: Server, user_id: str, seconds: float, headers: dict[str, str]) -> tuple[list[float], int]:
    """The keyed client's latencies while four clients with `headers` read the dashboard; and their request count.

    The readers are processes of their own (benchmarks.load_reader), timed from their first answer on."""
    command = [sys.executable, "-m", "benchmarks.load_reader", f"{server.base}/dashboard",
               *(f"--header={name}={value}" for name, value in headers.items())]  # fmt: skip
    readers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(4)]
    try:
        for reader in readers:
            assert reader.stdout is not None and reader.stdout.readline().strip() == "ready", "a reader failed"
        latencies = _latencies(server, user_id, seconds)
    finally:
        for reader in readers:
            reader.terminate()
    counts = [int(reader.communicate(timeout=120)[0].strip() or 0) for reader in readers]
    return latencies, sum(counts)


def adapter_files(server: Server, root: Path, domain: str, adapter: Path) -> list[Case]:
    """A domain-adapted champion with an adapter root: links that never resolve, a file of another model, and the
    same adapter swapped in twice."""
    group = "api: adapters"
    folder = root / domain
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "loop.pt").unlink(missing_ok=True)
    os.symlink(folder / "loop.pt", folder / "loop.pt")  # a link to itself
    for name, target in (("ping.pt", "pong.pt"), ("pong.pt", "ping.pt")):  # a loop of two
        (folder / name).unlink(missing_ok=True)
        os.symlink(folder / target, folder / name)
    torch.save({"x": torch.zeros(2)}, folder / "wrong-keys.pt")
    (folder / "v1.pt").write_bytes(adapter.read_bytes())

    def c(name: str, expected: int, says: str, version: str, max_bytes: int | None = None) -> Case:
        path = f"/v1/admin/adapters/{domain}"
        return check(server, group, name, expected, says, "POST", path, max_bytes, json={"version": version},
                     headers=ADMIN)  # fmt: skip

    cases = [
        c("adapter: a symlink to itself", 404, "no adapter 'loop'", "loop"),
        c("adapter: a loop of two symlinks", 404, "no adapter 'ping'", "ping"),
        c("adapter: a file of other keys names no server path", 422, "wrong-keys.pt", "wrong-keys"),
    ]
    wrong = cases[-1]
    cases[-1] = Case(**{**wrong.record(), "clear": wrong.clear and str(root) not in wrong.message})
    first = httpx.post(f"{server.base}/v1/admin/adapters/{domain}", json={"version": "v1"}, headers=ADMIN, timeout=60)
    versions = [first.json().get("model_version", "")]
    for _ in range(6):
        again = httpx.post(f"{server.base}/v1/admin/adapters/{domain}", json={"version": "v1"}, headers=ADMIN,
                           timeout=60)  # fmt: skip
        versions.append(again.json().get("model_version", ""))
    cases.append(Case(
        group, "adapter: the same file swapped in 7 times", f"POST /v1/admin/adapters/{domain} v1 x 7",
        "one model_version for one adapter file", f"{len(set(versions))} version(s), {len(versions[-1])} chars",
        first.status_code == 200 and len(set(versions)) == 1, False, False, False, versions[-1],
    ))  # fmt: skip
    return cases
