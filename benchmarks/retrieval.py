"""FAISS retrieval benchmark: recall@k against exact search and queries per second, in one run; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.retrieval   # 1M items x 64-d, 1,000 queries, k=100 (~10 min on 2 cores)
    .venv/bin/python -m benchmarks.retrieval --config configs/benchmarks/retrieval-faiss-smoke.yaml   # 20,000 items
    .venv/bin/python -m benchmarks.retrieval --set noise=1.0 --set centres=4096   # another data shape

Settings: configs/benchmarks/retrieval-faiss.yaml (`--config`, `--set KEY=VALUE`). Data: synthetic unit vectors around
16,384 Gaussian centres (N(0, 1) centres, N(0, 0.6^2) noise per coordinate: ~61 items per centre at 1M, so a query's
top 100 spans several clusters), a clustered shape like learned item embeddings, neither trivially separable (few
large clusters: IVF cells then hold whole top-100 lists) nor uniform on the sphere (ANN's worst case; `--set
noise=1` comes close); the queries are drawn the same way, independently of the items. Every index of `indexes` is
built with `recsys.retrieval.build_index` (which logs its own recall check) and searched with the same queries in one
batch; QPS = queries / median wall time of `search` over `repeats` runs, exact search (`ExactTopK`, torch matmul +
topk) timed the same way in the same run. The search-time knob of each index (IVF nprobe, HNSW efSearch) is swept;
`chosen` is the fastest setting that reaches `target_recall`. Writes benchmarks/results/retrieval-faiss-<size>.json
(`-smoke` appended for a `smoke: true` config), with the settings and how to reproduce it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.reproduce import jsonable, mismatches
from recsys.retrieval import ExactTopK, IndexConfig, recall_at_k
from recsys.retrieval.faiss_index import FaissTopK, build_index

logger = logging.getLogger("benchmarks.retrieval")
KNOB_OF = {"ivf_flat": "nprobe", "ivf_pq": "nprobe", "hnsw": "ef_search"}  # each kind's search-time knob


@dataclass(frozen=True)
class IndexSweep:
    """One index, built once, and the values of its search-time knob, each searched and timed."""

    index: IndexConfig  # `recsys.retrieval.IndexConfig` fields
    knob: Literal["nprobe", "ef_search"]  # the kind's search-time knob: nprobe (IVF) or ef_search (HNSW)
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if KNOB_OF.get(self.index.kind) != self.knob:
            raise ValueError(
                f"a {self.index.kind} index has no search-time knob {self.knob!r} (ivf_flat and ivf_pq sweep nprobe, "
                "hnsw sweeps ef_search)"
            )

    def runs(self) -> list[IndexConfig]:
        """The index's config at each swept value."""
        if self.knob == "nprobe":
            return [replace(self.index, nprobe=value) for value in self.values]
        return [replace(self.index, ef_search=value) for value in self.values]


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (configs/benchmarks/retrieval-faiss*.yaml)."""

    smoke: bool  # a quick check, not a measurement: the result is named `-smoke`
    items: int  # catalog size
    dim: int
    centres: int  # Gaussian centres of the synthetic vectors, N(0, 1) per coordinate
    noise: float  # sigma of the N(0, sigma^2) noise per coordinate around a centre (before normalising)
    queries: int  # drawn like the items, independently of them; searched in one batch
    k: int
    target_recall: float  # `chosen` = the fastest setting whose recall@k reaches this
    repeats: int  # timed searches per setting (median, after one warm-up)
    indexes: tuple[IndexSweep, ...]


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def clustered(num: int, centres: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    """`num` unit vectors: a random centre plus N(0, noise^2) per coordinate, normalised."""
    points = centres[torch.randint(0, centres.shape[0], (num,), generator=gen)]
    return torch.nn.functional.normalize(points + noise * torch.randn(points.shape, generator=gen), dim=1)


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "configs/benchmarks/retrieval-faiss.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)

    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(s.centres, s.dim, generator=gen)
    items = clustered(s.items, centres, s.noise, gen)
    queries = clustered(s.queries, centres, s.noise, gen)
    exact = ExactTopK(items)
    exact_ids = exact.search(queries, s.k)[1]
    exact_s = median_seconds(lambda: exact.search(queries, s.k), s.repeats)
    logger.info("exact: %.1f queries/s", s.queries / exact_s)

    runs = []
    for sweep in s.indexes:
        index = build_index(items, config=sweep.index, eval_queries=queries, eval_k=s.k)
        assert index.report is not None
        for value in sweep.values:
            index.set_search_params(**{sweep.knob: value})
            recall = recall_at_k(index.search(queries, s.k)[1], exact_ids)
            seconds = median_seconds(lambda index=index: index.search(queries, s.k), s.repeats)  # type: ignore[misc]
            runs.append(_run(index, sweep.knob, value, recall, seconds, s.queries, exact_s))
            logger.info("%s %s=%d: recall@%d %.4f, %.1f queries/s", sweep.index.kind, sweep.knob, value, s.k, recall,
                        s.queries / seconds)  # fmt: skip
    reaching = [r for r in runs if r["recall"] >= s.target_recall]
    chosen = max(reaching, key=lambda r: r["queries_per_second"]) if reaching else None
    name = result_name(s)
    result = {
        "data": {
            "items": s.items,
            "dim": s.dim,
            "queries": s.queries,
            "centres": s.centres,
            "noise_sigma": s.noise,
            "metric": "ip",
            "vectors": "unit-normalised",
        },
        "k": s.k,
        "target_recall": s.target_recall,
        "exact": {"queries_per_second": significant(s.queries / exact_s), "impl": "ExactTopK (torch matmul + topk)"},
        "chosen": chosen,
        "runs": runs,
        "timer": _timer(s.repeats),
        "settings": jsonable(asdict(s)),
        **provenance("faiss-cpu"),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print(f"exact: {s.queries / exact_s:,.0f} queries/s")
    for r in runs:
        print(f"{r['kind']:<9} {r['knob']}={r['value']:<5} recall@{s.k} {r['recall']:.4f}  "
              f"{r['queries_per_second']:>9,.0f} q/s  x{r['speedup_vs_exact']:.1f} exact")  # fmt: skip
    print(f"chosen: {chosen and (chosen['kind'], chosen['knob'], chosen['value'])} -> {path}")
    return path


def result_name(s: Settings) -> str:
    size = f"{s.items // 1_000_000}m" if s.items >= 1_000_000 else f"{s.items // 1_000}k"
    return f"retrieval-faiss-{size}" + ("-smoke" if s.smoke else "")


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (name, data, k, target recall, timer, every run's index config, and
    `settings` where it has them) that differs from `settings`."""
    data = result.get("data", {})
    recorded = {
        "name": result.get("name"),
        "data.items": data.get("items"),
        "data.dim": data.get("dim"),
        "data.queries": data.get("queries"),
        "data.centres": data.get("centres"),
        "data.noise_sigma": data.get("noise_sigma"),
        "k": result.get("k"),
        "target_recall": result.get("target_recall"),
        "timer": result.get("timer"),
        "runs": [[r.get("kind"), r.get("knob"), r.get("value"), r.get("config")] for r in result.get("runs", [])],
    }
    expected: dict[str, Any] = {
        "name": result_name(settings),
        "data.items": settings.items,
        "data.dim": settings.dim,
        "data.queries": settings.queries,
        "data.centres": settings.centres,
        "data.noise_sigma": settings.noise,
        "k": settings.k,
        "target_recall": settings.target_recall,
        "timer": _timer(settings.repeats),
        "runs": [
            [config.kind, sweep.knob, getattr(config, sweep.knob), jsonable(asdict(config))]
            for sweep in settings.indexes
            for config in sweep.runs()
        ],
    }
    if "settings" in result:
        recorded |= {f"settings.{key}": value for key, value in result["settings"].items()}
        expected |= {f"settings.{key}": value for key, value in jsonable(asdict(settings)).items()}
    yield from mismatches(recorded, expected)


def _timer(repeats: int) -> str:
    return f"median wall time of {repeats} batched searches of all queries, after one warm-up"


def _run(
    index: FaissTopK, knob: str, value: int, recall: float, seconds: float, num_queries: int, exact_s: float
) -> dict[str, Any]:
    assert index.report is not None
    return {
        "kind": index.config.kind,
        "knob": knob,
        "value": value,
        "recall": significant(recall),
        "queries_per_second": significant(num_queries / seconds),
        "speedup_vs_exact": significant(exact_s / seconds),
        "build_seconds": index.report.build_seconds,
        "config": asdict(index.config),
    }


if __name__ == "__main__":
    main()
