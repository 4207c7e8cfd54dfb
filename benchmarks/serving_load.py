"""The serving benchmark's tools: a `recsys serve` process on a free loopback port (its start-up time and memory) and
wrk runs against one of its routes.

Memory is read from /proc (Linux, as wrk is): the resident set of the server process and every process under it
(`--workers N` forks N workers).
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks.common import significant, wait_until_ok

ADMIN_TOKEN = secrets.token_hex(32)
READY_TIMEOUT_S = 600  # a 10^6-item bundle takes minutes to load on 2 cores
SAMPLED_IDS = 2_000  # ids a wrk run draws its requests from
SERVER_LOG_LINES = 40  # of the server's output, added to an error raised while it serves


@dataclass(frozen=True)
class Route:
    """A route wrk drives: what the result calls it, and the Lua `request` function drawing from `ids`."""

    endpoint: str
    lua: str


RECOMMENDATIONS = Route(
    "POST /v1/recommendations {user_id, k: 10}",
    """
request = function()
  local body = '{"user_id": "' .. ids[math.random(#ids)] .. '", "k": 10}'
  return wrk.format("POST", "/v1/recommendations", {["Content-Type"] = "application/json"}, body)
end
""",
)
SIMILAR_ITEMS = Route(  # ids: URL-quoted item ids (they go in the path)
    "GET /v1/similar-items/{item_id}?k=10",
    """
request = function()
  return wrk.format("GET", "/v1/similar-items/" .. ids[math.random(#ids)] .. "?k=10")
end
""",
)
SEARCH = Route(  # ids: text queries (the search protocol's: lowercase words, nothing to escape)
    "POST /v1/search {query, k: 10}",
    """
request = function()
  local body = '{"query": "' .. ids[math.random(#ids)] .. '", "k": 10}'
  return wrk.format("POST", "/v1/search", {["Content-Type"] = "application/json"}, body)
end
""",
)
WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_JSON {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p95_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class Server:
    """A running `recsys serve`: its address, its process id, and the seconds from its start to a ready /readyz."""

    base: str
    pid: int
    startup_seconds: float


@contextmanager
def serve(
    name: str, uri: str, workers: int, history_store: str, redis_url: str, added_items_file: Path | None = None
) -> Iterator[Server]:
    """`recsys serve` of the registered model `name`'s champion with `workers` processes on a free loopback port,
    until the block ends (an admin token, champion checks every second; run-time items kept in `added_items_file`, off
    when None)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as secrets_dir, tempfile.TemporaryFile("w+") as log:
        token_file = Path(secrets_dir) / "admin-token"
        token_file.write_text(ADMIN_TOKEN)
        store = ["--history-store", history_store, "--redis-url", redis_url]
        if added_items_file is not None:
            store += ["--added-items-file", str(added_items_file)]
        start = time.perf_counter()
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("recsys")), "serve", "--model-name", name, "--tracking-uri", uri,
             "--port", str(port), "--workers", str(workers), *store, "--admin-token-file", str(token_file),
             "--reload-interval-s", "1"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            if not wait_until_ok(f"{base}/readyz", READY_TIMEOUT_S, alive=lambda: server.poll() is None):
                raise SystemExit(f"the API at {base} did not become ready in {READY_TIMEOUT_S} s")
            yield Server(base, server.pid, significant(time.perf_counter() - start))
        except BaseException as err:  # the server's side of what went wrong (a worker killed, a traceback)
            log.seek(0)
            err.add_note(f"the server's last log lines:\n{''.join(log.readlines()[-SERVER_LOG_LINES:])}")
            raise
        finally:
            server.terminate()
            server.wait(timeout=60)


def wrk(base: str, route: Route, ids: list[str], duration: int, connections: int, seed: int) -> dict[str, Any]:
    """wrk on `route` for `duration` seconds with `connections` connections, each request drawing one of (a seeded
    sample of) `ids`: requests/s, latency percentiles and every error wrk counts (non-2xx statuses included)."""
    sample = random.Random(seed).sample(ids, min(len(ids), SAMPLED_IDS))
    lua = f"local ids = {{{', '.join(json.dumps(i) for i in sample)}}}\nmath.randomseed({seed})\n{route.lua}{WRK_DONE}"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "5s", "-s", script.name, base],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    Path(script.name).unlink()
    stats = json.loads(next(line for line in out.splitlines() if line.startswith("WRK_JSON"))[len("WRK_JSON ") :])
    seconds = stats["duration_us"] / 1e6
    errors = {k: stats[k] for k in ("connect", "read", "write", "status", "timeout")}
    return {
        "duration_s": significant(seconds),
        "requests": stats["requests"],
        "requests_per_second": significant(stats["requests"] / seconds),
        "latency_ms": {p: significant(stats[f"{p}_us"] / 1e3) for p in ("p50", "p95", "p99")},
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
    }


def rss_mib(pid: int) -> float:
    """The resident memory (MiB) of process `pid` and every process under it, now."""
    kib = 0
    for process in _with_descendants(pid):
        try:
            status = Path(f"/proc/{process}/status").read_text()
        except OSError:  # it ended meanwhile
            continue
        kib += sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return significant(kib / 1024)


class PeakRss:
    """The highest `rss_mib(pid)` sampled every `every` seconds while the block runs (`.mib`)."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every, self.mib = pid, every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            self.mib = max(self.mib, rss_mib(self.pid))
            if self._stop.wait(self.every):
                return


def percentiles(times: list[float], ps: tuple[int, ...]) -> dict[str, float]:
    q = statistics.quantiles(times, n=100, method="inclusive")
    return {f"p{p}": significant(q[p - 1]) for p in ps}


def _with_descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "pid (comm)": state, ppid
        except (OSError, IndexError, ValueError):  # it ended meanwhile
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        process = todo.pop()
        found.append(process)
        todo += children.get(process, [])
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
