"""Items added at run time, through the real server: a content-first model serves items it has never seen, placed by
their text alone (`POST /v1/admin/items`), at the rate the offline cold-start evaluation gives.

Usage:
    .venv/bin/python -m benchmarks.runtime_items                  # benchmarks/configs/beauty-runtime-items.yaml
    .venv/bin/python -m benchmarks.runtime_items --prepare-only   # the data without the items, and how to train on it
    .venv/bin/python -m benchmarks.runtime_items --model-dir DIR  # a model trained elsewhere (a GPU) by that command

Steps (the config: the experiment, the raw data, how many items, the load):
1. `items` items are withheld from the raw data (`withhold_items`): drawn uniformly (seed `seed`) among the items
   that are some user's last item, as the cold-start protocol's cold items are drawn among all items. Their events
   leave every sequence and their rows the catalogue (WORK/raw); WORK/withheld.json keeps their ids and titles and,
   for every user whose last item is one of them, that item and the history before it.
2. The experiment (a content-first model on the cold-start protocol) is trained on WORK/raw: here, or elsewhere with
   the printed `recsys train` command and then `--model-dir`. Its bundle (HNSW index) is registered in a fresh MLflow
   store and served by `recsys serve` with run-time items on (an admin token; wrk needs `apt-get install -y wrk`).
3. wrk drives `POST /v1/recommendations` for `duration_s` seconds (the latency before adding); then for as long again
   while the withheld items are added one per call, evenly spread over the run: each add call's latency, and wrk's.
4. For every user of step 1: `POST /v1/recommendations {history, k: 50}` with the history before their item; the
   share whose top 50 holds it (with a bootstrap interval over users) against the offline cold-start figures: the
   served model's own test_cold R@50 (its metrics.json) and the reference result's (`offline_reference`).
Writes benchmarks/results/<result_name>.json.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
import torch

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
from benchmarks.serving import check_trained_with, register_model_dir
from benchmarks.serving_load import ADMIN_TOKEN, RECOMMENDATIONS, percentiles, serve, wrk
from pipelines.config import load_config
from pipelines.runner import run_pipeline
from pipelines.steps import TRAIN_STEP
from recsys.artifacts.model_dir import METRICS_FILE, trained_data_dir
from recsys.evaluation.uncertainty import Uncertainty, bootstrap_intervals
from recsys.retrieval.config import IndexKind
from recsys.runtime.atomic import atomic_directory

SEQUENCES, ITEMS = "user_sequence.txt", "items.csv"  # the amazon-p5 raw files
WITHHELD = "withheld.json"
REDIS_UNUSED = "redis://127.0.0.1:6379/13"  # the server's in-memory history store reads no Redis


@dataclass(frozen=True)
class Settings:
    experiment: str  # the experiment config (a path in the repo): a content-first model on the cold-start protocol
    raw_data: str  # the amazon-p5 raw directory the items are withheld from
    items: int = 100
    seed: int = 0  # of the draw of the withheld items
    work_dir: str = ".cache/bench-runtime-items"
    duration_s: int = 20  # of each wrk run: before adding, and while adding
    connections: int = 8
    k: int = 50
    # the served index: "flat" (exact) ranks the catalogue as the offline evaluation does, so the served rate differs
    # from the offline one by the added items' placement alone
    index: IndexKind = "flat"
    offline_reference: str = "benchmarks/results/beauty-cold-start.json"  # a comparisons result on the cold protocol
    offline_label: str = "content-first"  # its model of the experiment's config
    result_name: str = "beauty-runtime-items"


@dataclass(frozen=True)
class Withheld:
    """The withheld items ({item_id, title}) and their users ({user_id, item_id, history}: the history before the
    item, oldest first)."""

    items: list[dict[str, str]]
    targets: list[dict[str, Any]]


def withhold_items(raw: Path, out: Path, count: int, seed: int) -> Withheld:
    """Write `out` (raw files without `count` items drawn among the users' last items, and WITHHELD); idempotent: an
    `out` written with the same arguments is read back."""
    record, source = out / WITHHELD, {"raw": str(raw.resolve()), "count": count, "seed": seed}
    if record.is_file():
        kept = json.loads(record.read_text())
        if kept["source"] == source:
            return Withheld(kept["items"], kept["targets"])
    sequences = [line.split() for line in (raw / SEQUENCES).read_text().splitlines() if line.strip()]
    catalogue = pl.read_csv(raw / ITEMS, schema_overrides={"item_id": pl.String})
    last_items = sorted({row[-1] for row in sequences if len(row) > 1})
    if len(last_items) < count:
        raise SystemExit(f"only {len(last_items)} items are some user's last item; asked to withhold {count}")
    chosen = set(np.random.default_rng(seed).choice(last_items, size=count, replace=False).tolist())
    titles = dict(catalogue.filter(pl.col("item_id").is_in(list(chosen))).select("item_id", "title").iter_rows())
    withheld = Withheld(
        items=[{"item_id": item, "title": titles.get(item) or ""} for item in sorted(chosen)],
        targets=[{"user_id": row[0], "item_id": row[-1], "history": row[1:-1]}
                 for row in sequences if len(row) > 1 and row[-1] in chosen],
    )  # fmt: skip
    with atomic_directory(out, marker=WITHHELD) as tmp:
        kept_rows = [[row[0], *(item for item in row[1:] if item not in chosen)] for row in sequences]
        (tmp / SEQUENCES).write_text("".join(" ".join(row) + "\n" for row in kept_rows if len(row) > 1))
        catalogue.filter(~pl.col("item_id").is_in(list(chosen))).write_csv(tmp / ITEMS)
        (tmp / WITHHELD).write_text(json.dumps({"source": source, "items": withheld.items,
                                                "targets": withheld.targets}, indent=1))  # fmt: skip
    return withheld


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path | None:
    parser = benchmark_parser(__doc__, "benchmarks/configs/beauty-runtime-items.yaml")
    parser.add_argument("--model-dir", type=Path, help="serve this model, trained by the --prepare-only command")
    parser.add_argument("--prepare-only", action="store_true", help="withhold the items, print the training command")
    args = parser.parse_args(argv)
    reproduce = reproduce_of(__name__, args)
    settings = load_settings(args.config, reproduce.overrides)
    log_to_console()
    work = (REPO / settings.work_dir).resolve()
    raw = work / "raw"
    withheld = withhold_items((REPO / settings.raw_data).resolve(), raw, settings.items, settings.seed)
    print(f"{len(withheld.items)} items withheld, {len(withheld.targets)} users whose last item is one -> {raw}")
    experiment = {"data.path": str(raw), "tracking.enabled": False}
    if args.prepare_only:
        print(f"train: .venv/bin/recsys train --config {settings.experiment} --set data.path=RAW --work-dir WORK "
              f"(RAW: {raw} or a copy of it); then --model-dir WORK/models/<the config's name>")  # fmt: skip
        return None
    model_dir = args.model_dir.resolve() if args.model_dir else _train(settings, experiment, work)
    result = _measure(settings, model_dir, withheld, work)
    result["settings"] = vars(settings) | {"model_dir": str(model_dir)}
    path = write_result(settings.result_name, {**result, **provenance("fastapi", "uvicorn", "faiss-cpu")},
                        args.results_dir, reproduce)  # fmt: skip
    print(json.dumps({k: result[k] for k in ("served", "add_call_ms", "recommendations")}, indent=1))
    print(f"-> {path}")
    return path


def _train(settings: Settings, experiment: dict[str, Any], work: Path) -> Path:
    config = load_config(REPO / settings.experiment, {**experiment, "train.progress": False})
    outputs, _ = run_pipeline(config, work, until=TRAIN_STEP)
    assert outputs.model is not None  # the last step run
    return outputs.model.model_dir


def _measure(settings: Settings, model_dir: Path, withheld: Withheld, work: Path) -> dict[str, Any]:
    registry = work / "registry"
    uri = f"sqlite:///{registry / 'mlflow.db'}"
    added_file = work / "added-items.json"
    shutil.rmtree(registry, ignore_errors=True)  # a fresh store: the model is version 1, the champion
    added_file.unlink(missing_ok=True)  # no kept items: every add is new
    served = {"tracking.enabled": True, "tracking.uri": uri, "pipeline.index.kind": settings.index}
    config = load_config(REPO / settings.experiment, served)
    check_trained_with(model_dir, config, REPO / settings.experiment)
    data_dir = trained_data_dir(model_dir)
    if not (data_dir / "meta.json").is_file():  # trained on another machine: its bundle copies the data from here
        raise SystemExit(
            f"{model_dir} was trained on {data_dir}, which is not on this machine. Fix: prepare it there "
            f"(deterministic): .venv/bin/recsys data prepare --source {config.data.source} --input {work / 'raw'} "
            f"--cold-start-fraction {config.data.cold_start_fraction} --seed {config.data.seed} --out {data_dir}"
        )
    register_model_dir(model_dir, config, work)
    users = [target["user_id"] for target in withheld.targets]  # wrk's requests: users the bundle knows
    with serve(config.registered_model_name, uri, 1, "memory", REDIS_UNUSED, added_items_file=added_file) as server:
        before = wrk(server.base, RECOMMENDATIONS, users, settings.duration_s, settings.connections, seed=0)
        adds: list[float] = []
        live: list[int] = []
        adder = threading.Thread(target=_add_items, args=(server.base, withheld.items, settings.duration_s, adds, live))
        adder.start()
        during = wrk(server.base, RECOMMENDATIONS, users, settings.duration_s, settings.connections, seed=1)
        adder.join()
        hits = _hits(server.base, withheld, settings.k)
    offline = _offline_figures(settings, model_dir)
    rate = float(hits.mean())
    low, high = bootstrap_intervals(hits[:, None], Uncertainty()).squeeze(0).tolist()
    return {
        "served": {"items_added": len(adds), "live_after": live[-1] if live else 0, "users": len(hits),
                   f"recall@{settings.k}": significant(rate), "interval": [significant(low), significant(high)],
                   **{f"offline_{name}_within_interval": low <= value <= high for name, value in offline.items()
                      if value is not None}},
        "offline": offline,
        "add_call_ms": {**percentiles(adds, (50, 99)), "max": significant(max(adds)), "first": significant(adds[0]),
                        "calls": len(adds), "items_per_call": 1},
        "recommendations": {"before_adding": before, "while_adding": during,
                            "p99_ratio": significant(during["latency_ms"]["p99"] / before["latency_ms"]["p99"])},
        "protocol": (f"{settings.items} items withheld from the data before training (drawn among users' last items), "
                     "added through POST /v1/admin/items one per call while wrk drives POST /v1/recommendations "
                     f"{{user_id, k: 10}}; then each user whose last item was withheld asks for k={settings.k} with "
                     "the history before it: the share whose list holds it (95% bootstrap interval over users)"),
    }  # fmt: skip


def _add_items(base: str, items: list[dict[str, str]], over_s: float, latencies: list[float], live: list[int]) -> None:
    """Add `items` one per call, evenly spread over `over_s` seconds; each call's ms into `latencies`."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    gap = over_s / len(items)
    with httpx.Client(base_url=base, timeout=30) as client:
        for item in items:
            start = time.perf_counter()
            response = client.post("/v1/admin/items", json={"items": [item]}, headers=headers)
            latencies.append((time.perf_counter() - start) * 1e3)
            if response.status_code != 200:
                raise SystemExit(f"adding {item['item_id']}: {response.status_code} {response.text}")
            live.append(response.json()["live"])
            time.sleep(max(0.0, gap - (time.perf_counter() - start)))


def _hits(base: str, withheld: Withheld, k: int) -> torch.Tensor:
    """(U,) 1.0 where the user's withheld item is in the top `k` the server gives their history."""
    hits = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for target in withheld.targets:
            response = client.post("/v1/recommendations", json={"history": target["history"], "k": k})
            response.raise_for_status()
            ids = {item["item_id"] for item in response.json()["items"]}
            hits.append(float(target["item_id"] in ids))
    return torch.tensor(hits)


def _offline_figures(settings: Settings, model_dir: Path) -> dict[str, float | None]:
    """The offline cold-start R@k: the served model's own test_cold slice, and the reference result's seed mean."""
    metric = f"recall@{settings.k}"
    own = json.loads((model_dir / METRICS_FILE).read_text()).get("test_cold", {}).get(metric)
    reference = json.loads((REPO / settings.offline_reference).read_text())["models"].get(settings.offline_label, {})
    mean = reference.get(f"cold.{metric}", {}).get("mean")
    return {"served_model_test_cold": own, "reference_seed_mean": mean}


if __name__ == "__main__":
    main()
