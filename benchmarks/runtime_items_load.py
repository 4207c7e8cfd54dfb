"""Run-time items under load, through the real server: a large add beside recommendations, and the time to ready with
many kept items.

Usage:
    .venv/bin/python -m benchmarks.runtime_items_load      # benchmarks/configs/runtime-items-load.yaml
    nice -n -10 .venv/bin/python -m benchmarks.runtime_items_load   # on cores shared with other work: the server and
                                                                    # wrk first (the change thread stays 19 below)

Steps (the config: the experiment, the sizes, the load):
1. The experiment (a small content-first SASRec on the synthetic data) runs its pipeline into WORK (kept while up to
   date): trained, indexed, registered as the champion of a fresh MLflow store in WORK.
2. `recsys serve` of that champion with run-time items on (an empty kept file): after a warm-up run, `rounds` pairs
   of wrk runs on `POST /v1/recommendations` `{user_id, k: 10}`, `duration_s` seconds each: one without an add, one
   while a `POST /v1/admin/items` of `add_items` new items runs, sent `add_delay_s` into it (the latency during the
   add, and the add call's own time). All runs are of one server in one session, so their p99s compare; each run
   records the machine's load average after it (the 2 cores are shared).
3. The server started with no kept items, then over a kept file of `kept_items` items twice: the first start embeds
   every text (no vectors cached yet), the second reads their cached vectors: the seconds from the process's start to
   a ready /readyz of each (the first, what any start costs on this machine).
Writes benchmarks/results/<result_name>.json.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    REPO,
    benchmark_parser,
    log_to_console,
    provenance,
    reproduce_of,
    settings_from,
    significant,
    write_result,
)
from benchmarks.serving_load import ADMIN_TOKEN, RECOMMENDATIONS, serve, wrk
from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.added_items import AddedItemStore, NewItem
from recsys.artifacts.catalogue import read_catalogue
from recsys.artifacts.registry import download_champion_bundle

REDIS_UNUSED = "redis://127.0.0.1:6379/13"  # the server's in-memory history store reads no Redis
# the words of the made-up titles
WORDS = ("red", "blue", "green", "amber", "matte", "glossy", "silk", "velvet", "daily", "travel", "mini", "deluxe",
         "herbal", "citrus", "vanilla", "rose", "cedar", "ocean", "lipstick", "mascara", "serum", "cream", "balm",
         "toner", "cleanser", "palette", "brush", "polish", "shampoo", "mask", "oil", "gel",
         "mist", "powder")  # fmt: skip


@dataclass(frozen=True)
class Settings:
    experiment: str  # the experiment config (a path in the repo), made content-first by `overrides`
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys of the experiment
    work_dir: str = ".cache/bench-runtime-items-load"
    duration_s: int = 20  # of each wrk run: without the add, and during it
    connections: int = 8
    add_items: int = 1_000  # items of the one add during load
    add_delay_s: float = 2.0  # into the wrk run during the add
    rounds: int = 2  # pairs of wrk runs (without an add, during one), alternating
    warmup_s: int = 5  # a first wrk run, not reported
    kept_items: int = 10_000  # items of the kept file the server starts over
    seed: int = 0  # of the items' texts
    result_name: str = "runtime-items-load"


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/runtime-items-load.yaml")
    args = parser.parse_args(argv)
    reproduce = reproduce_of(__name__, args)
    settings = load_settings(args.config, reproduce.overrides)
    log_to_console()
    work = (REPO / settings.work_dir).resolve()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    config = load_config(
        REPO / settings.experiment, {**settings.overrides, "tracking.uri": uri, "train.progress": False}
    )
    run_pipeline(config, work)
    name = config.registered_model_name
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None, "the pipeline registered its champion"
    users = read_catalogue(bundle.catalogue_file)[1].user_ids
    result: dict[str, Any] = {
        "load": _add_under_load(settings, name, uri, users, work),
        "startup": _time_to_ready(settings, name, uri, work),
        "settings": vars(settings),
        "server": "recsys serve of the champion, 1 worker, in-memory history store, --torch-threads 1, exact index "
        "(flat); wrk and the server on the same 2 cores",
        "nice": os.getpriority(os.PRIO_PROCESS, 0),  # of this process, hence of the server and wrk it starts
    }
    path = write_result(settings.result_name, {**result, **provenance("fastapi", "uvicorn")}, args.results_dir,
                        reproduce)  # fmt: skip
    load = result["load"]
    summary = {
        "p99_ms": [
            (r["without_add"]["latency_ms"]["p99"], r["during_add"]["latency_ms"]["p99"]) for r in load["rounds"]
        ],
        "p99_ratio_max": load["p99_ratio_max"],
        "startup": result["startup"],
    }
    print(json.dumps(summary, indent=1))
    print(f"-> {path}")
    return path


def _add_under_load(settings: Settings, name: str, uri: str, users: list[str], work: Path) -> dict[str, Any]:
    """Of one server: a warm-up wrk run (not reported), then `rounds` pairs of wrk runs, without an add and during one
    add of `add_items` new items: each pair's figures, the add call's time, the p99 ratio; the machine's load."""
    kept = work / "load" / "added-items.json"
    shutil.rmtree(kept.parent, ignore_errors=True)
    kept.parent.mkdir(parents=True)
    rounds: list[dict[str, Any]] = []
    ratios: list[float] = []
    with serve(name, uri, 1, "memory", REDIS_UNUSED, added_items_file=kept) as server:
        wrk(server.base, RECOMMENDATIONS, users, settings.warmup_s, settings.connections, seed=99)
        for r in range(settings.rounds):
            without = _wrk_run(server.base, users, settings, seed=2 * r)
            add: dict[str, Any] = {}
            items = _items(settings.add_items, settings.seed + r, f"added-{r}")
            adder = threading.Thread(target=_add, args=(server.base, items, settings.add_delay_s, add))
            adder.start()
            during = _wrk_run(server.base, users, settings, seed=2 * r + 1)
            adder.join()
            if add.get("status") != 200:
                raise SystemExit(f"the add failed: {add}")
            ended_in_run = settings.add_delay_s + add["seconds"] <= during["duration_s"]
            ratios.append(significant(during["latency_ms"]["p99"] / without["latency_ms"]["p99"]))
            rounds.append({
                "without_add": without, "during_add": during,
                "add_call": {"items": len(items), "seconds": add["seconds"], "live_after": add["live"],
                             "ended_within_the_wrk_run": ended_in_run},
                "p99_ratio": ratios[-1],
            })  # fmt: skip
    return {"rounds": rounds, "p99_ratio_max": max(ratios), "p99_ratio_median": significant(statistics.median(ratios))}


def _wrk_run(base: str, users: list[str], settings: Settings, seed: int) -> dict[str, Any]:
    """One wrk run of `duration_s` on recommendations, with the machine's 1-minute load average after it (other
    processes on the shared cores show there)."""
    run = wrk(base, RECOMMENDATIONS, users, settings.duration_s, settings.connections, seed=seed)
    return {**run, "load_average_1m_after": significant(os.getloadavg()[0])}


def _add(base: str, items: list[NewItem], delay_s: float, out: dict[str, Any]) -> None:
    """One `POST /v1/admin/items` of `items` after `delay_s` seconds: its status, seconds and the live count into
    `out`."""
    time.sleep(delay_s)
    body = {"items": [{"item_id": i.item_id, "title": i.title, "fields": i.fields} for i in items]}
    start = time.perf_counter()
    response = httpx.post(f"{base}/v1/admin/items", json=body, timeout=600,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})  # fmt: skip
    out["seconds"] = significant(time.perf_counter() - start)
    out["status"] = response.status_code
    out["live"] = response.json().get("live") if response.status_code == 200 else response.text


def _time_to_ready(settings: Settings, name: str, uri: str, work: Path) -> dict[str, Any]:
    """Seconds from the start of `recsys serve` to a ready /readyz: with run-time items on and none kept (what any
    start costs here: imports, the registry, the bundle), then over a kept file of `kept_items` items without their
    vectors cached (the first start) and with them."""
    kept = work / "startup" / "added-items.json"
    shutil.rmtree(kept.parent, ignore_errors=True)
    kept.parent.mkdir(parents=True)
    starts = {"none_kept_seconds": _start_seconds(name, uri, kept, 0)}
    AddedItemStore(kept).save(_items(settings.kept_items, settings.seed + 1, "kept"))
    starts["first_start_seconds"] = _start_seconds(name, uri, kept, settings.kept_items)
    starts["cached_start_seconds"] = _start_seconds(name, uri, kept, settings.kept_items)
    return {"kept_items": settings.kept_items, **starts}


def _start_seconds(name: str, uri: str, kept: Path, items: int) -> float:
    """The seconds `recsys serve` over the kept file `kept` takes to be ready, serving its `items` items."""
    with serve(name, uri, 1, "memory", REDIS_UNUSED, added_items_file=kept) as server:
        version = httpx.get(f"{server.base}/readyz", timeout=10).json()["model_version"]
    if items and not version.endswith(f"+items:{items}"):
        raise SystemExit(f"the server did not serve the {items} kept items: {version}")
    return server.startup_seconds


def _items(count: int, seed: int, prefix: str) -> list[NewItem]:
    """`count` new items with distinct made-up titles (three to six words and a number), drawn with `seed`."""
    rng = random.Random(seed)
    return [NewItem(f"{prefix}-{n}", " ".join(rng.choices(WORDS, k=rng.randint(3, 6))) + f" no. {n}")
            for n in range(count)]  # fmt: skip


if __name__ == "__main__":
    main()
