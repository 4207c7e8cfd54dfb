"""FAISS indexes over a trained model's item vectors, queried by its users: recall@k against exact search and
queries per second, in one run; writes JSON.

Usage:
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m benchmarks.retrieval_trained \
        --set model_dir=/work/scale/models/sasrec-1m   # 10^6 items: ~25 min on 2 cores
    .venv/bin/python -m benchmarks.retrieval_trained --config benchmarks/configs/retrieval-trained-smoke.yaml \
        --set model_dir=runs/models/synthetic-sasrec   # a small model: a quick check

Settings: benchmarks/configs/retrieval-trained.yaml (`--config`, `--set KEY=VALUE`; `model_dir` has no default: it
is the model directory written by `recsys train`). Data: the model's item vectors (`item_embeddings()` without the
padding row, ids 1..V), and as queries the user vectors (`encode_queries`) of a seeded sample of `queries` users of
the data it was trained on, each encoded from its history before its validation item (what `recsys index build`
checks recall with). Exact search and every index setting are timed in the same run, as `benchmarks.retrieval` does
(`measure`): each index built with `recsys.retrieval.build_index` (a training sample, a build budget, its recall
check), its search-time knob swept, QPS = queries / median wall time of one batched search of all queries, `chosen` =
the fastest setting reaching `target_recall`. Writes benchmarks/results/retrieval-trained-<items>.json (`-smoke`
appended for a `smoke: true` config). `OMP_WAIT_POLICY=PASSIVE`: on 2 cores the spinning OpenMP pools of torch and
faiss take the cores from each other (docs/retrieval.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.reproduce import jsonable, mismatches
from benchmarks.retrieval import (
    IndexSweep,
    expected_runs,
    measure,
    measured_record,
    print_table,
    recorded_runs,
    recorded_settings,
    size_label,
    timer_record,
)
from pipelines.index import item_vectors, user_queries, vector_model
from recsys.artifacts.model_dir import load_model_dir, model_sha256

logger = logging.getLogger("benchmarks.retrieval_trained")
QUERY_SOURCE = "encode_queries of a seeded sample of users, each from its history before its validation item"


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/retrieval-trained*.yaml)."""

    smoke: bool  # a quick check, not a measurement: the result is named `-smoke`
    model_dir: str | None  # a model directory written by `recsys train` (required: --set model_dir=DIR)
    queries: int  # users sampled (with `seed`) from the model's data; their query vectors, searched in one batch
    seed: int
    k: int
    target_recall: float  # `chosen` = the fastest setting whose recall@k reaches this
    repeats: int  # timed searches per setting (median, after one warm-up)
    indexes: tuple[IndexSweep, ...]


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/retrieval-trained.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    if s.model_dir is None:
        raise SystemExit("model_dir is not set. Fix: --set model_dir=DIR, a model directory written by `recsys train`")

    model_dir = Path(s.model_dir)
    trained = load_model_dir(model_dir)
    model = vector_model(trained, model_dir)
    items, ids = item_vectors(model)
    queries = user_queries(model, trained.data, s.queries, s.seed)
    logger.info("%s: %d item vectors (D=%d), %d user queries", model_dir, len(items), items.shape[1], len(queries))
    measured = measure(items, ids, queries, s.k, s.indexes, s.repeats, s.target_recall)
    result = {
        "data": {
            "model_dir": s.model_dir,
            "model": trained.name,
            "model_sha256": model_sha256(model_dir),
            "items": len(items),
            "dim": items.shape[1],
            "users": trained.data.num_users,
            "queries": len(queries),
            "query_source": QUERY_SOURCE,
            "metric": "ip",
        },
        "k": s.k,
        "target_recall": s.target_recall,
        **measured_record(measured, s.repeats),
        "settings": jsonable(asdict(s)),
        **provenance("faiss-cpu"),
    }
    path = write_result(result_name(s, len(items)), result, args.results_dir, reproduce)
    print_table(measured, s.k, path)
    return path


def result_name(s: Settings, items: int) -> str:
    return f"retrieval-trained-{size_label(items)}" + ("-smoke" if s.smoke else "")


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (name, model dir, k, target recall, timer, every run's index config,
    `settings`) that differs from `settings`."""
    data = result.get("data", {})
    recorded = {
        "name": result.get("name"),
        "data.model_dir": data.get("model_dir"),
        "k": result.get("k"),
        "target_recall": result.get("target_recall"),
        "timer": result.get("timer"),
        "runs": recorded_runs(result),
        **recorded_settings(result, Settings),
    }
    expected: dict[str, Any] = {
        "name": result_name(settings, int(data.get("items", 0))),
        "data.model_dir": settings.model_dir,
        "k": settings.k,
        "target_recall": settings.target_recall,
        "timer": timer_record(settings.repeats),
        "runs": expected_runs(settings.indexes),
        **{f"settings.{key}": value for key, value in jsonable(asdict(settings)).items()},
    }
    yield from mismatches(recorded, expected)


if __name__ == "__main__":
    main()
