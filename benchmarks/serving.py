"""Serving load test: `recsys serve` over an experiment's registered champion, driven by wrk on loopback; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.serving --epochs 3   # Beauty SASRec (trains its pipeline once, ~10 min on 2 cores)
    .venv/bin/python -m benchmarks.serving --config configs/synthetic/sasrec.yaml --duration 5   # quick
    .venv/bin/python -m benchmarks.serving --config configs/beauty/two-stage.yaml --epochs 1 \
        --set model.retriever_dir=.cache/serving-bench/models/beauty-sasrec   # the ranker over the SASRec above

    .venv/bin/python -m benchmarks.serving --epochs 3 --history-store redis --workers 1 2   # 1 vs 2 workers

`--config` is an experiment config in the repo (default configs/beauty/sasrec.yaml); `--set KEY=VALUE`, `--epochs N`
(= `--set train.epochs=N`: serving cost depends on the model's shape, not its training) and `--data-dir` (=
`--set data.path=DIR`) override it, and the index served is HNSW unless `--set pipeline.index.kind=...` says
otherwise: all of these are the result's `reproduce` overrides. The load test's own knobs (--duration,
--connections, --model-calls, --freshness-trials, --workers, --history-store) are recorded in the result's
`load_test`.

Needs `wrk` (apt-get install -y wrk). Steps, in one run:
1. The config's pipeline (`pipelines.runner.run_pipeline`, steps kept when up to date) -> the registered champion
   (SQLite store in --work-dir).
2. The model call alone: `Recommender.recommend` for --model-calls users in this process (p50/p99).
3. For each of --workers (default 1), in one session: `recsys serve --workers N` in its own process(es) on a free
   loopback port (--history-store: in-process, or Redis, which N > 1 needs; an admin token; champion checks every
   second so every worker follows a new champion), then
   a. wrk, --connections connections for --duration seconds: `POST /v1/recommendations` {user_id, k: 10} for
      users drawn at random from the data; requests/s, latency p50/p95/p99 and every error wrk counts
      (connect/read/write/timeout and non-2xx statuses); with one worker, the server's own count of model calls
      and requests per call (micro-batching) from its /metrics (each worker has its own);
   b. freshness (first worker count only): for --freshness-trials new users, the time from sending
      `POST /v1/events` to holding a recommendation that reads the event (history_length 1), p50/p99;
   c. hot swap under load: the same wrk load while a better-scoring copy of the model is registered, promoted
      and loaded (`POST /v1/admin/reload` reaches one worker, the others follow at their next check); its errors
      must be 0, and afterwards every answer must come from the new champion.
Writes benchmarks/results/serving-<config name without -sasrec>[-redis].json.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

import benchmarks.quality as quality
from benchmarks.common import benchmark_parser, provenance, reproduce_of, significant, wait_until_ok, write_result
from pipelines.bundle import Bundle
from pipelines.config import ExperimentConfig, load_config
from pipelines.registry import register_bundle
from pipelines.runner import PipelineOutputs, run_pipeline
from recsys.data.prepared import load_prepared

WRK_SCRIPT = """
local users = {%s}
math.randomseed(%d)
request = function()
  local body = '{"user_id": "' .. users[math.random(#users)] .. '", "k": 10}'
  return wrk.format("POST", "/v1/recommendations", {["Content-Type"] = "application/json"}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_JSON {"requests": %%d, "duration_us": %%d, "connect": %%d, "read": %%d, ' ..
    '"write": %%d, "status": %%d, "timeout": %%d, "p50_us": %%d, "p95_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""
# what the benchmark sets on every config, recorded as overrides (its own default: `--set` changes it)
DEFAULTS = {"pipeline.index.kind": "hnsw"}


def load_settings(config: Path, overrides: dict[str, Any]) -> ExperimentConfig:
    return load_config(config, overrides)


def recorded_mismatches(result: dict[str, Any], config: ExperimentConfig) -> Iterator[str]:
    """The served model, index, training epochs and settings the result records that differ from `config`'s."""
    bundle = result.get("bundle", {})
    expected: dict[str, Any] = {"model": config.model.name, "index": config.pipeline.index.kind}
    if bundle.get("train_epochs") != "config":  # "config": the config's own epochs (not overridden)
        expected["train_epochs"] = config.train.epochs
    for key, value in expected.items():
        if bundle.get(key) != value:
            yield f"bundle.{key}: the result has {bundle.get(key)!r}, the config {value!r}"
    name = result_name(config, result.get("load_test", {}).get("history_store", "memory"))
    if result.get("name") != name:
        yield f"name: the result has {result.get('name')!r}, the config gives {name!r}"
    if "settings" in result:  # results before 2026-11-22 recorded the served model in `bundle` only
        yield from quality.recorded_mismatches(result, config)


def result_name(config: ExperimentConfig, history_store: str = "memory") -> str:
    return f"serving-{config.name.removesuffix('-sasrec')}" + ("" if history_store == "memory" else f"-{history_store}")


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "configs/beauty/sasrec.yaml")
    parser.add_argument("--data-dir", type=Path, help="raw data instead of the config's data.path (= --set data.path)")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/serving-bench"), help="data, models, MLflow")
    parser.add_argument(
        "--epochs", type=int, help="= --set train.epochs (serving cost depends on the model's shape, not its training)"
    )
    parser.add_argument("--duration", type=int, default=30, help="seconds of each wrk run")
    parser.add_argument("--connections", type=int, default=8, help="concurrent HTTP connections")
    parser.add_argument("--model-calls", type=int, default=500, help="users of the in-process model-call timing")
    parser.add_argument("--freshness-trials", type=int, default=200, help="new users of the freshness timing")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="server processes, one run each")
    parser.add_argument("--history-store", choices=["memory", "redis"], default="memory")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="the redis store's server")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    if args.history_store == "memory" and max(args.workers) > 1:
        raise SystemExit("--workers above 1 share users' events through Redis: add --history-store redis")

    overrides: dict[str, Any] = dict(DEFAULTS)
    if args.data_dir is not None:
        overrides["data.path"] = str(args.data_dir)
    if args.epochs is not None:
        overrides["train.epochs"] = args.epochs
    reproduce = reproduce_of(__name__, args, overrides)
    overrides = reproduce.overrides
    work = args.work_dir.resolve()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    # the registry the server reads, no progress bars: not part of what a result reproduces
    config = load_config(
        args.config, {**overrides, "tracking.enabled": True, "tracking.uri": uri, "train.progress": False}
    )
    outputs, _ = run_pipeline(config, work)
    assert outputs.data is not None and outputs.model is not None and outputs.registration is not None
    data = load_prepared(outputs.data.data_dir)
    users = data.users["user_id"].to_list()
    name = config.registered_model_name

    model_call_ms = _model_call_ms(Bundle(outputs.registration.bundle_dir), users, args.model_calls)
    runs, freshness = [], None
    for workers in args.workers:
        with _server(name, uri, workers, args) as base:
            load = _wrk(base, users, args.duration, args.connections, seed=0)
            run: dict[str, Any] = {"workers": workers, **load}
            if workers == 1:  # each worker counts its own model calls: one worker's /metrics is the whole server's
                run["server_batching"] = _server_batching(base)
            if freshness is None:
                freshness = _freshness_ms(base, data.items["item_id"].to_list(), args.freshness_trials)
            run["hot_swap"] = _hot_swap_under_load(base, work, outputs, name, uri, users, args)
            runs.append(run)

    result = {
        "bundle": {
            "config": str(args.config),
            "overrides": args.set,
            "model": config.model.name,
            "items": data.num_items,
            "users": data.num_users,
            "index": config.pipeline.index.kind,
            "train_epochs": config.train.epochs if "train.epochs" in overrides else "config",
        },
        "endpoint": "POST /v1/recommendations {user_id, k: 10}, users drawn uniformly from the data",
        "server": f"recsys serve --workers N: micro-batching (max 64), {args.history_store} history store, admin "
        "token, champion checks every second, same 2-core machine as wrk",
        "load_generator": f"wrk, 1 thread, {args.connections} connections, {args.duration} s",
        "load_test": {
            "duration_s": args.duration,
            "connections": args.connections,
            "model_calls": args.model_calls,
            "freshness_trials": args.freshness_trials,
            "workers": args.workers,
            "history_store": args.history_store,
        },
        "concurrency": args.connections,
        "runs": runs,
        "model_call_ms": model_call_ms,
        "freshness_ms": freshness,
        "settings": quality.settings_record(config),
        **provenance("fastapi", "uvicorn", "faiss-cpu", "redis"),
    }
    path = write_result(result_name(config, args.history_store), result, args.results_dir, reproduce)
    print(json.dumps({"runs": runs, "model_call_ms": model_call_ms, "freshness_ms": freshness}, indent=1))
    print(f"-> {path}")
    return path


ADMIN_TOKEN = secrets.token_hex(32)


@contextmanager
def _server(name: str, uri: str, workers: int, args: argparse.Namespace) -> Iterator[str]:
    """`recsys serve` of the champion with `workers` processes on a free loopback port, until the block ends."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as secrets_dir:
        token_file = Path(secrets_dir) / "admin-token"
        token_file.write_text(ADMIN_TOKEN)
        store = ["--history-store", args.history_store, "--redis-url", args.redis_url]
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("recsys")), "serve", "--model-name", name, "--tracking-uri", uri,
             "--port", str(port), "--workers", str(workers), *store, "--admin-token-file", str(token_file),
             "--reload-interval-s", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            if not wait_until_ok(f"{base}/readyz", 120, alive=lambda: server.poll() is None):
                raise SystemExit(f"the API at {base} did not become ready in 120 s")
            yield base
        finally:
            server.terminate()
            server.wait(timeout=60)


def _model_call_ms(bundle: Bundle, users: list[str], calls: int) -> dict[str, float]:
    """The model call alone: history lookup excluded, `Recommender.recommend` timed per user."""
    from serving.recommender import Recommender

    recommender = Recommender(bundle)
    rng = random.Random(1)
    histories = [(recommender.training_history(rng.choice(users)) or ([], []))[0] for _ in range(calls)]
    times = []
    for history in histories:
        start = time.perf_counter()
        recommender.recommend(history[-recommender.max_history :], 10, True)
        times.append((time.perf_counter() - start) * 1e3)
    return _percentiles(times, (50, 99))


def _wrk(base: str, users: list[str], duration: int, connections: int, seed: int) -> dict[str, Any]:
    sample = random.Random(seed).sample(users, min(len(users), 2_000))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % (", ".join(json.dumps(u) for u in sample), seed))
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


def _server_batching(base: str) -> dict[str, float]:
    """Model calls the server made so far (from its /metrics): how many, requests per call, ms per call."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text)
        for sample in family.samples
    }
    calls = samples["recsys_model_batch_size_count"]
    return {
        "model_calls": int(calls),
        "mean_requests_per_call": significant(samples["recsys_model_batch_size_sum"] / calls),
        "mean_model_call_ms": significant(samples["recsys_model_call_seconds_sum"] / calls * 1e3),
    }


def _freshness_ms(base: str, item_ids: list[str], trials: int) -> dict[str, float]:
    """Event sent -> a recommendation that reads it in hand (new users: history_length goes 0 -> 1)."""
    times = []
    with httpx.Client(base_url=base, timeout=10) as http:
        for trial in range(trials):
            user = f"freshness-{trial}"
            start = time.perf_counter()
            http.post("/v1/events", json={"user_id": user, "item_ids": [item_ids[trial % len(item_ids)]]})
            while http.post("/v1/recommendations", json={"user_id": user}).json()["history_length"] < 1:
                pass
            times.append((time.perf_counter() - start) * 1e3)
    return _percentiles(times, (50, 99))


def _hot_swap_under_load(
    base: str, work: Path, outputs: PipelineOutputs, name: str, uri: str, users: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """wrk load while a better-scoring copy of the model is registered, promoted and swapped in."""
    import threading

    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(_wrk(base, users, args.duration, args.connections, 1)))
    runner.start()
    time.sleep(args.duration / 3)
    model = work / "swap-model"
    shutil.rmtree(model, ignore_errors=True)
    assert outputs.model is not None
    shutil.copytree(outputs.model.model_dir, model)
    metrics = json.loads((model / "metrics.json").read_text())
    metrics["valid"]["ndcg@10"] += 1.0  # a copy that the gate must promote
    (model / "metrics.json").write_text(json.dumps(metrics))
    bundle = Bundle.write(work / "swap-bundle", name=name, model_dir=model)
    decision = register_bundle(bundle, name, uri)
    start = time.perf_counter()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    reload = httpx.post(f"{base}/v1/admin/reload", headers=headers, timeout=120).json()
    swap_seconds = time.perf_counter() - start
    runner.join()
    # new connections reach every worker; each follows the champion at its next check (every second)
    every_worker = _seconds_until_every_worker_serves(base, users[0], reload["model_version"], timeout_s=60)
    return {
        "promoted_version": decision.version,
        "reloaded": reload["reloaded"],
        "reload_seconds": significant(swap_seconds),
        "requests": result["requests"],
        "errors": result["errors"],
        "latency_ms": result["latency_ms"],
        "every_worker_serves_it": every_worker is not None,
        "seconds_until_every_worker_serves_it": every_worker,
    }


def _seconds_until_every_worker_serves(base: str, user: str, version: str, timeout_s: float) -> float | None:
    """Seconds (after the load ended) until 20 requests in a row, each on a new connection, all come from `version`;
    None if that does not happen within `timeout_s`."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        answered = {
            httpx.post(f"{base}/v1/recommendations", json={"user_id": user}, timeout=10).json()["model_version"]
            for _ in range(20)
        }
        if answered == {version}:
            return significant(time.perf_counter() - start)
        time.sleep(0.2)
    return None


def _percentiles(times: list[float], ps: tuple[int, ...]) -> dict[str, float]:
    q = statistics.quantiles(times, n=100, method="inclusive")
    return {f"p{p}": significant(q[p - 1]) for p in ps}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
