"""Serving load test: `recsys serve` over an experiment's registered champion, driven by wrk on loopback; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.serving --epochs 3   # Beauty SASRec (trains its pipeline once, ~10 min on 2 cores)
    .venv/bin/python -m benchmarks.serving --config configs/synthetic/sasrec.yaml --duration 5   # quick
    .venv/bin/python -m benchmarks.serving --config benchmarks/configs/beauty/two-stage.yaml --epochs 1 \
        --set model.upstream.retriever=.cache/serving-bench/models/beauty-sasrec   # the ranker over the SASRec above

    .venv/bin/python -m benchmarks.serving --epochs 3 --history-store redis --workers 1 2   # 1 vs 2 workers

    .venv/bin/python -m benchmarks.serving --config configs/synthetic/sasrec.yaml --set ... \
        --model-dir /work/scale/models/sasrec-1m --set pipeline.index.kind=ivf_pq ...   # a trained model, at scale

`--config` is an experiment config in the repo (default configs/beauty/sasrec.yaml); `--set KEY=VALUE`, `--epochs N`
(= `--set train.schedule.epochs=N`: serving cost depends on the model's shape, not its training) and `--data-dir` (=
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
      and requests per call (micro-batching) from its /metrics (each worker has its own), and its full garbage
      collections during the load (how many, their total pause: a full collection stops every request);
   b. freshness (first worker count only): for --freshness-trials new users, the time from sending
      `POST /v1/events` to holding a recommendation that reads the event (history_length 1), p50/p99;
   c. hot swap under load: the same wrk load while a better-scoring copy of the model is registered, promoted
      and loaded (`POST /v1/admin/reload` reaches one worker, the others follow at their next check); its errors
      must be 0, and afterwards every answer must come from the new champion;
   d. a query-aware model (`query_aware`): wrk on `POST /v1/search` {query, k: 10}, the queries drawn from the
      search protocol's title-3 test queries of random items (docs/search.md): encoding them is in the latency.
Writes benchmarks/results/serving-<config name without -sasrec>[-redis].json.

With `--model-dir DIR` (a model directory `recsys train` wrote with --config and the same --set: checked), the
pipeline is not run: the model's FAISS index is built with `pipeline.index` (kept in --work-dir across runs while
the model and the index config are the same), its bundle registered in a fresh MLflow store under --work-dir, and for
each of --workers `recsys serve` is started and measured: its start-up time (process start -> /readyz ready), its
resident memory (server and workers) once ready and at its peak under load, and wrk, as in 3a, on
`POST /v1/recommendations` and then on `GET /v1/similar-items/{item_id}?k=10` (items drawn at random from the
catalogue), and for a query-aware model on `POST /v1/search` as in 3d. No model-call, freshness or hot-swap timing
(the steps above that need the pipeline). Writes benchmarks/results/serving-<config name without -sasrec>-<items>
[-redis].json. With `--baseline-model-dir DIR` (registered as the config it was trained with, its `config.yaml`; the
model's index settings) the same session then serves the model and the baseline one at a time in `--rounds`
alternating wrk runs on `POST /v1/recommendations`, each server with `--round-workers` processes (default 1; more
need `--history-store redis`), and records their medians and ratios (`against_baseline`): e.g. a distilled student
against the SASRec it replaces:

    .venv/bin/python -m benchmarks.serving --config configs/beauty/distill-two-stage.yaml --model-dir STUDENT_DIR \
        --baseline-model-dir .cache/bench/models/beauty-sasrec --duration 20 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

import benchmarks.quality as quality
from benchmarks.common import (
    Reproduce,
    benchmark_parser,
    log_to_console,
    provenance,
    reproduce_of,
    significant,
    write_result,
)
from benchmarks.retrieval import size_label
from benchmarks.serving_load import (
    ADMIN_TOKEN,
    RECOMMENDATIONS,
    SAMPLED_IDS,
    SEARCH,
    SIMILAR_ITEMS,
    PeakRss,
    percentiles,
    rss_mib,
    serve,
    wrk,
)
from pipelines.config import ExperimentConfig, load_config
from pipelines.index import build_index_step
from pipelines.registry import POINT, register_bundle
from pipelines.runner import run_pipeline
from pipelines.steps import PipelineOutputs
from pipelines.tracking import start_tracking
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import CONFIG_FILE, MODEL_FILE, trained_data
from recsys.data.prepared import SequenceData, load_prepared
from recsys.evaluation.queries import QueryMaker
from recsys.inference import VectorScorer
from recsys.models.family import Input
from recsys.models.registry import load_model
from recsys.retrieval.faiss_index import FaissTopK

# what the benchmark sets on every config, recorded as overrides (its own default: `--set` changes it)
DEFAULTS = {"pipeline.index.kind": "hnsw"}
MODEL_DIR = "model dir"  # a --model-dir result's train_epochs: the model directory's own training
EPOCHS_KEYS = {"train.schedule.epochs", "train.epochs"}  # the override of the training's epochs (and its old name)


def load_settings(config: Path, overrides: dict[str, Any]) -> ExperimentConfig:
    return load_config(config, overrides)


def recorded_mismatches(result: dict[str, Any], config: ExperimentConfig) -> Iterator[str]:
    """The served model, index, training epochs and settings the result records that differ from `config`'s."""
    bundle = result.get("bundle", {})
    expected: dict[str, Any] = {"model": config.model.name, "index": config.pipeline.index.kind}
    if bundle.get("train_epochs") not in ("config", MODEL_DIR):  # the config's own epochs, or a model dir's
        expected["train_epochs"] = config.train.schedule.epochs
    for key, value in expected.items():
        if bundle.get(key) != value:
            yield f"bundle.{key}: the result has {bundle.get(key)!r}, the config {value!r}"
    items = bundle.get("items") if "model_dir" in bundle else None  # a --model-dir run names its catalogue size
    name = result_name(config, result.get("load_test", {}).get("history_store", "memory"), items)
    if result.get("name") != name:
        yield f"name: the result has {result.get('name')!r}, the config gives {name!r}"
    if "settings" in result:  # results before 2026-11-22 recorded the served model in `bundle` only
        yield from quality.recorded_mismatches(result, config, bundle.get("items"))


def result_name(config: ExperimentConfig, history_store: str = "memory", items: int | None = None) -> str:
    """serving-<config name without -sasrec>[-<items> of a --model-dir run][-<history store but memory>]."""
    size = "" if items is None else f"-{size_label(items)}"
    store = "" if history_store == "memory" else f"-{history_store}"
    return f"serving-{config.name.removesuffix('-sasrec')}{size}{store}"


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "configs/beauty/sasrec.yaml")
    parser.add_argument("--data-dir", type=Path, help="raw data instead of the config's data.path (= --set data.path)")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/serving-bench"), help="data, models, MLflow")
    parser.add_argument(
        "--epochs",
        type=int,
        help="= --set train.schedule.epochs (serving cost depends on the model's shape, not its training)",
    )
    parser.add_argument("--duration", type=int, default=30, help="seconds of each wrk run")
    parser.add_argument("--connections", type=int, default=8, help="concurrent HTTP connections")
    parser.add_argument("--model-calls", type=int, default=500, help="users of the in-process model-call timing")
    parser.add_argument("--freshness-trials", type=int, default=200, help="new users of the freshness timing")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="server processes, one run each")
    parser.add_argument("--history-store", choices=["memory", "redis"], default="memory")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="the redis store's server")
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="serve this model directory (trained with --config and its --set) instead of running the pipeline: "
        "start-up time, memory, recommendations and similar items under load",
    )
    parser.add_argument(
        "--baseline-model-dir",
        type=Path,
        help="with --model-dir: also serve this model directory (as the config it was trained with) in the same "
        "session, in wrk rounds alternating with --model-dir's: medians and ratios of throughput and p99",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the --baseline-model-dir runs")
    parser.add_argument(
        "--round-workers",
        type=int,
        default=1,
        help="server processes of each --rounds run (above 1: --history-store redis; full collections are counted "
        "with 1 only, /metrics being per worker)",
    )
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    if args.round_workers < 1:
        raise SystemExit(f"--round-workers {args.round_workers}: a server has at least 1 worker. Fix: 1 or more")
    if args.history_store == "memory" and max(*args.workers, args.round_workers) > 1:
        raise SystemExit(
            "--workers or --round-workers above 1 share users' events through Redis: add --history-store redis"
        )
    if args.model_dir is not None and (args.data_dir is not None or args.epochs is not None):
        raise SystemExit(
            "--model-dir serves a model already trained: --data-dir and --epochs do not apply. Fix: drop them"
        )
    if args.baseline_model_dir is not None and args.model_dir is None:
        raise SystemExit("--baseline-model-dir is compared with a --model-dir. Fix: add --model-dir")

    overrides: dict[str, Any] = dict(DEFAULTS)
    if args.data_dir is not None:
        overrides["data.path"] = str(args.data_dir)
    if args.epochs is not None:
        overrides["train.schedule.epochs"] = args.epochs
    reproduce = reproduce_of(__name__, args, overrides)
    overrides = reproduce.overrides
    work = args.work_dir.resolve()
    if args.model_dir is not None:
        return _model_dir_run(args, reproduce, work)
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
    runs: list[dict[str, Any]] = []
    freshness = None
    for workers in args.workers:
        with serve(name, uri, workers, args.history_store, args.redis_url) as server:
            base = server.base
            load = (  # each worker has its own /metrics: with several, two reads may come from two of them
                _wrk_with_full_collections(base, users, args, seed=0)
                if workers == 1
                else wrk(base, RECOMMENDATIONS, users, args.duration, args.connections, seed=0)
            )
            run: dict[str, Any] = {"workers": workers, **load}
            if workers == 1:  # each worker counts its own model calls: one worker's /metrics is the whole server's
                run["server_batching"] = _server_batching(base)
            if freshness is None:
                freshness = _freshness_ms(base, data.items["item_id"].to_list(), args.freshness_trials)
            run["hot_swap"] = _hot_swap_under_load(base, work, outputs, name, uri, users, args, swap=len(runs) + 1)
            if Input.QUERIES in config.model.reads():
                run["search"] = wrk(base, SEARCH, _queries(data), args.duration, args.connections, seed=0)
            runs.append(run)

    result = {
        "bundle": {
            "config": str(args.config),
            "overrides": args.set,
            "model": config.model.name,
            "items": data.num_items,
            "users": data.num_users,
            "index": config.pipeline.index.kind,
            "train_epochs": config.train.schedule.epochs if EPOCHS_KEYS & overrides.keys() else "config",
        },
        "endpoint": f"{RECOMMENDATIONS.endpoint}, users drawn uniformly from the data",
        "server": _server_description(args),
        "load_generator": _load_generator(args),
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
        "settings": quality.settings_record(config, data.num_items),
        **provenance("fastapi", "uvicorn", "faiss-cpu", "redis"),
    }
    path = write_result(result_name(config, args.history_store), result, args.results_dir, reproduce)
    print(json.dumps({"runs": runs, "model_call_ms": model_call_ms, "freshness_ms": freshness}, indent=1))
    print(f"-> {path}")
    return path


def _model_dir_run(args: argparse.Namespace, reproduce: Reproduce, work: Path) -> Path:
    """--model-dir: index, bundle and register the trained model, then for each worker count serve it and measure
    start-up, memory, and both routes under wrk."""
    log_to_console()  # a 10^6-item index build takes minutes: its progress lines show
    registry = work / "model-dir-registry"
    shutil.rmtree(registry, ignore_errors=True)  # a fresh store: the model becomes version 1, the champion
    uri = f"sqlite:///{registry / 'mlflow.db'}"
    config = load_config(args.config, {**reproduce.overrides, "tracking.enabled": True, "tracking.uri": uri})
    model_dir = args.model_dir.resolve()
    check_trained_with(model_dir, config, args.config)
    bundle = register_model_dir(model_dir, config, work)
    data = trained_data(bundle.model_dir)
    users = data.users["user_id"].to_list()
    items = [quote(item, safe="") for item in data.items["item_id"].to_list()]  # path segments
    runs = []
    for workers in args.workers:
        with serve(config.registered_model_name, uri, workers, args.history_store, args.redis_url) as server:
            ready_mib = rss_mib(server.pid)
            with PeakRss(server.pid) as peak:
                recommendations = wrk(server.base, RECOMMENDATIONS, users, args.duration, args.connections, seed=0)
                similar = None  # a model without item vectors (a ranker) has no index to answer similar items from
                if bundle.index_dir is not None:
                    similar = wrk(server.base, SIMILAR_ITEMS, items, args.duration, args.connections, seed=0)
                search = None
                if Input.QUERIES in config.model.reads():
                    search = wrk(server.base, SEARCH, _queries(data), args.duration, args.connections, seed=0)
        runs.append({
            "workers": workers, "startup_s": server.startup_seconds,
            "rss_mib": {"ready": ready_mib, "peak_under_load": peak.mib},
            "recommendations": recommendations,
            **({} if similar is None else {"similar_items": similar}),
            **({} if search is None else {"search": search}),
        })  # fmt: skip
    baseline = None
    if args.baseline_model_dir is not None:
        baseline = _against_baseline(args, config.registered_model_name, uri, users, work, reproduce)
    report = None if bundle.index_dir is None else FaissTopK.read_report(bundle.index_dir)
    result = {
        "bundle": {
            "config": str(args.config),
            "overrides": args.set,
            "model": config.model.name,
            "model_dir": str(model_dir),
            "items": data.num_items,
            "users": data.num_users,
            "index": config.pipeline.index.kind,  # the config's, as a pipeline run records it; built: index_build
            "index_build": report and dataclasses.asdict(report),
            "train_epochs": MODEL_DIR,
        },
        "endpoints": {
            "recommendations": f"{RECOMMENDATIONS.endpoint}, users drawn uniformly from the data",
            "similar_items": f"{SIMILAR_ITEMS.endpoint}, items drawn uniformly from the catalogue",
        },
        "startup": "seconds from starting `recsys serve` to /readyz answering 200 (the champion's bundle loaded)",
        "memory": "resident set of the server and its workers (MiB): once ready, and the peak sampled every 0.5 s "
        "under both wrk runs",
        "server": _server_description(args),
        "load_generator": _load_generator(args),
        "load_test": {
            "duration_s": args.duration,
            "connections": args.connections,
            "workers": args.workers,
            "history_store": args.history_store,
        },
        "concurrency": args.connections,
        "runs": runs,
        **({} if baseline is None else {"against_baseline": baseline}),
        "settings": quality.settings_record(config, data.num_items),
        **provenance("fastapi", "uvicorn", "faiss-cpu", "redis"),
    }
    path = write_result(result_name(config, args.history_store, data.num_items), result, args.results_dir, reproduce)
    print(json.dumps({"runs": runs, "against_baseline": baseline}, indent=1))
    print(f"-> {path}")
    return path


def _against_baseline(
    args: argparse.Namespace, name: str, uri: str, users: list[str], work: Path, reproduce: Reproduce
) -> dict[str, Any]:
    """--baseline-model-dir: it and the --model-dir champion `name` served one at a time (--round-workers), in --rounds
    alternating wrk runs on `POST /v1/recommendations` (which goes first alternating too), so both see the same
    machine; medians and the model's ratios to the baseline (throughput > 1 and p99 < 1 favour the model)."""
    baseline_dir = args.baseline_model_dir.resolve()
    baseline_config = load_config(
        baseline_dir / CONFIG_FILE,
        {**DEFAULTS, **_index_overrides(reproduce), "tracking.enabled": True, "tracking.uri": uri},
    )
    if baseline_config.registered_model_name == name:
        raise SystemExit(
            f"--baseline-model-dir {baseline_dir} registers as {name}, as --model-dir does. Fix: compare models "
            "trained under different config names"
        )
    register_model_dir(baseline_dir, baseline_config, work)
    served = {"model": name, "baseline": baseline_config.registered_model_name}
    rounds: dict[str, list[dict[str, Any]]] = {role: [] for role in served}
    for round_ in range(args.rounds):
        order = list(served.items())
        for role, registered in order[::-1] if round_ % 2 else order:  # ABBA: neither always runs first
            with serve(registered, uri, args.round_workers, args.history_store, args.redis_url) as server:
                if args.round_workers == 1:
                    rounds[role].append(_wrk_with_full_collections(server.base, users, args, seed=round_))
                else:
                    rounds[role].append(wrk(server.base, RECOMMENDATIONS, users, args.duration, args.connections,
                                            seed=round_))  # fmt: skip
    medians = {
        role: {
            "requests_per_second": statistics.median(r["requests_per_second"] for r in runs),
            "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
        }
        for role, runs in rounds.items()
    }
    model, base = medians["model"], medians["baseline"]
    return {
        "baseline": baseline_config.registered_model_name,
        "baseline_model_dir": str(baseline_dir),
        "rounds": args.rounds,
        "workers": args.round_workers,
        "medians": medians,
        "throughput_ratio": significant(model["requests_per_second"] / base["requests_per_second"]),
        "p99_ratio": significant(model["p99_ms"] / base["p99_ms"]),
        "runs": rounds,
    }


def _index_overrides(reproduce: Reproduce) -> dict[str, Any]:
    """The --set keys of the served index (the baseline gets the same index as the model)."""
    return {key: value for key, value in reproduce.overrides.items() if key.startswith("pipeline.index.")}


def _queries(data: SequenceData) -> list[str]:
    """The search protocol's title-3 test queries of (up to) SAMPLED_IDS items drawn at random: what the search route
    is asked under load."""
    titles = ["", *data.items["title"].fill_null("").to_list()]
    items = random.Random(0).sample(range(1, len(titles)), min(len(titles) - 1, SAMPLED_IDS))
    return [q for q in QueryMaker(titles).test_queries(items, "title-3") if q]


def check_trained_with(model_dir: Path, config: ExperimentConfig, config_path: Path) -> None:
    """Refuse a model directory trained with another name or model than `config`: the result's `reproduce` (the
    config and its --set) must be what made the model."""
    trained = yaml.safe_load((model_dir / CONFIG_FILE).read_text())
    ours = config.model_dump(mode="json")
    differing = [key for key in ("name", "model.name", "model.params", "model.training")
                 if _at(trained, key) != _at(ours, key)]  # fmt: skip
    if differing:
        raise SystemExit(
            f"{model_dir} was trained with another {', '.join(differing)} than --config {config_path} with its --set "
            "gives. Fix: pass the --config and --set the model was trained with"
        )


def _at(tree: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def register_model_dir(model_dir: Path, config: ExperimentConfig, work: Path) -> Bundle:
    """The model's index (`pipeline.index`, kept while up to date; none for a model without item vectors, as the
    pipeline's build_index step) and bundle under `work`, registered as the champion of `config`'s registered
    model."""
    name = config.registered_model_name
    index_dir = None
    if isinstance(load_model(model_dir / MODEL_FILE)[1], VectorScorer):  # a ranker has no item vectors to index
        index_dir = build_index_step(model_dir, work / "indexes" / name, config.pipeline.index)
    bundle = Bundle.write(work / "bundles" / name, name=name, model_dir=model_dir, index_dir=index_dir)
    with start_tracking(config.tracking, config.experiment_name, f"serving benchmark: register {model_dir}"):
        decision = register_bundle(bundle, name, config.tracking.resolved_uri())
    if not decision.promoted:
        raise SystemExit(f"{model_dir} did not become the champion, so there is nothing to serve: {decision.reason}")
    return bundle


def _server_description(args: argparse.Namespace) -> str:
    return (
        f"recsys serve --workers N: micro-batching (max 64), {args.history_store} history store, admin token, "
        "champion checks every second, same 2-core machine as wrk"
    )


def _load_generator(args: argparse.Namespace) -> str:
    return f"wrk, 1 thread, {args.connections} connections, {args.duration} s"


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
    return percentiles(times, (50, 99))


def _metric_samples(base: str) -> dict[str, float]:
    """The server's /metrics now: each sample's value by its name and labels (`name{label=value}`)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.name + "".join(f"{{{key}={value}}}" for key, value in sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text)
        for sample in family.samples
    }


FULL_COLLECTIONS = "recsys_gc_pause_seconds_{}{{generation=2}}"


def _wrk_with_full_collections(base: str, users: list[str], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """wrk on the recommendations route, and the server's full garbage collections while it ran: how many, and their
    total pause (from its /metrics)."""
    before = _metric_samples(base)
    load = wrk(base, RECOMMENDATIONS, users, args.duration, args.connections, seed=seed)
    after = _metric_samples(base)

    def grown(part: str) -> float:
        key = FULL_COLLECTIONS.format(part)
        return after.get(key, 0.0) - before.get(key, 0.0)

    return {**load, "full_collections": {"count": int(grown("count")), "pause_ms": significant(grown("sum") * 1e3)}}


def _server_batching(base: str) -> dict[str, float]:
    """Model calls the server made so far (from its /metrics): how many, requests per call, ms per call."""
    samples = _metric_samples(base)
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
    return percentiles(times, (50, 99))


def _hot_swap_under_load(
    base: str,
    work: Path,
    outputs: PipelineOutputs,
    name: str,
    uri: str,
    users: list[str],
    args: argparse.Namespace,
    swap: int,
) -> dict[str, Any]:
    """wrk load while a better-scoring copy of the model (the `swap`-th: each scores higher than the last, so it is a
    new bundle, not a registration made before) is registered, promoted and swapped in."""
    import threading

    result: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: result.update(wrk(base, RECOMMENDATIONS, users, args.duration, args.connections, 1))
    )
    runner.start()
    time.sleep(args.duration / 3)
    model = work / "swap-model"
    shutil.rmtree(model, ignore_errors=True)
    assert outputs.model is not None
    shutil.copytree(outputs.model.model_dir, model)
    metrics = json.loads((model / "metrics.json").read_text())
    metrics["valid"]["ndcg@10"] += swap  # a copy that the gate must promote
    (model / "metrics.json").write_text(json.dumps(metrics))
    bundle = Bundle.write(work / "swap-bundle", name=name, model_dir=model)
    decision = register_bundle(bundle, name, uri, POINT)  # better by its metrics.json alone: the point rule
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


if __name__ == "__main__":
    main()
