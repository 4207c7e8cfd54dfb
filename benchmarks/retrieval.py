"""FAISS retrieval benchmark: recall@k against exact search and queries per second, in one run; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.retrieval   # 1M items x 64-d, 1,000 queries, k=100 (~10 min on 2 cores)
    .venv/bin/python -m benchmarks.retrieval --config benchmarks/configs/retrieval-faiss-smoke.yaml   # 20,000 items
    .venv/bin/python -m benchmarks.retrieval --set noise=1.0 --set centres=4096   # another data shape

Settings: benchmarks/configs/retrieval-faiss.yaml (`--config`, `--set KEY=VALUE`). Data: synthetic unit vectors around
16,384 Gaussian centres (N(0, 1) centres, N(0, 0.6^2) noise per coordinate: ~61 items per centre at 1M, so a query's
top 100 spans several clusters), a clustered shape like learned item embeddings, neither trivially separable (few
large clusters: IVF cells then hold whole top-100 lists) nor uniform on the sphere (ANN's worst case; `--set
noise=1` comes close); the queries are drawn the same way, independently of the items. Every index of `indexes` is
built with `recsys.retrieval.build_index` (which logs its own recall check) and searched with the same queries in one
batch; QPS = queries / median wall time of `search` over `repeats` runs, exact search (`ExactTopK`, torch matmul +
topk) timed the same way in the same run. A search-time knob of each index (IVF nprobe, HNSW efSearch, a refined
IVF-PQ's refine_k_factor) is swept; sweeps of one index that differ only in search-time knobs share one build.
`chosen` is the fastest setting that reaches `target_recall`. Writes benchmarks/results/retrieval-faiss-<size>.json
(`-smoke` appended for a `smoke: true` config), with the settings and how to reproduce it.
`benchmarks.retrieval_trained` measures the same over a trained model's item vectors and user queries.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from benchmarks.common import (
    benchmark_parser,
    median_seconds,
    parse_run,
    provenance,
    settings_from,
    significant,
    write_result,
)
from benchmarks.reproduce import jsonable, mismatches
from recsys.errors import ConfigError
from recsys.retrieval import ExactTopK, IndexConfig, recall_at_k
from recsys.retrieval.faiss_index import FaissTopK, build_index
from recsys.runtime.validation import config_from

logger = logging.getLogger("benchmarks.retrieval")
Knob = Literal["nprobe", "ef_search", "refine_k_factor"]
KIND_KNOB: dict[str, Knob] = {"ivf_flat": "nprobe", "ivf_pq": "nprobe", "hnsw": "ef_search"}  # each kind's own
INTEGER_KNOBS = ("nprobe", "ef_search")


def knobs_of(config: IndexConfig) -> tuple[Knob, ...]:
    """The search-time knobs of an index: IVF nprobe, HNSW ef_search, and refine_k_factor when it re-ranks."""
    own = [KIND_KNOB[config.kind]] if config.kind in KIND_KNOB else []
    refine: list[Knob] = ["refine_k_factor"] if config.refine_k_factor is not None else []
    return (*own, *refine)


@dataclass(frozen=True)
class IndexSweep:
    """One index and the values of one of its search-time knobs, each searched and timed."""

    index: IndexConfig  # `recsys.retrieval.IndexConfig` fields
    knob: Knob  # nprobe (IVF), ef_search (HNSW) or refine_k_factor (IVF-PQ with refine_k_factor set)
    values: tuple[int | float, ...]

    def __post_init__(self) -> None:
        if self.knob not in knobs_of(self.index):
            raise ValueError(
                f"a {self.index.kind} index has no search-time knob {self.knob!r} (ivf_flat and ivf_pq sweep nprobe, "
                "hnsw sweeps ef_search, an ivf_pq index with refine_k_factor set may sweep that)"
            )
        if self.knob in INTEGER_KNOBS and not all(isinstance(value, int) for value in self.values):
            raise ValueError(f"{self.knob} values must be integers, got {list(self.values)}")

    def runs(self) -> list[IndexConfig]:
        """The index's config at each swept value."""
        return [replace(self.index, **{self.knob: value}) for value in self.values]  # type: ignore[arg-type]


def build_key(config: IndexConfig) -> IndexConfig:
    """What decides how an index is built: its config with the search-time knobs at fixed values."""
    refine = None if config.refine_k_factor is None else 1.0
    return replace(config, nprobe=1, ef_search=1, refine_k_factor=refine)


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/retrieval-faiss*.yaml)."""

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


@dataclass(frozen=True)
class Measured:
    """Exact search's queries/s, one record per index setting (`_run`), and the fastest reaching the target."""

    exact_queries_per_second: float
    runs: list[dict[str, Any]]
    chosen: dict[str, Any] | None


def measure(
    items: torch.Tensor,
    ids: torch.Tensor | None,
    queries: torch.Tensor,
    k: int,
    sweeps: tuple[IndexSweep, ...],
    repeats: int,
    target_recall: float,
) -> Measured:
    """Time exact search and every swept index setting over (V, D) `items` with (B, D) `queries`, in this process.

    Each index is built with `build_index` (its recall check on `queries`); consecutive sweeps that build the same
    index (`build_key`) share one build.
    """
    num_queries = len(queries)
    exact = ExactTopK(items, ids)
    exact_ids = exact.search(queries, k)[1]
    exact_s = median_seconds(lambda: exact.search(queries, k), repeats)
    logger.info("exact: %.1f queries/s", num_queries / exact_s)

    runs: list[dict[str, Any]] = []
    index: FaissTopK | None = None
    for sweep in sweeps:
        if index is None or build_key(index.config) != build_key(sweep.index):
            index = None  # the previous index is freed before the next one is built
            index = build_index(items, ids, sweep.index, eval_queries=queries, eval_k=k)
        for config in sweep.runs():
            index.set_search_params(nprobe=config.nprobe, ef_search=config.ef_search,
                                    refine_k_factor=config.refine_k_factor)  # fmt: skip
            recall = recall_at_k(index.search(queries, k)[1], exact_ids)
            seconds = median_seconds(lambda index=index: index.search(queries, k), repeats)  # type: ignore[misc]
            value = getattr(config, sweep.knob)
            runs.append(_run(index, sweep.knob, value, recall, seconds, num_queries, exact_s))
            logger.info("%s %s=%g: recall@%d %.4f, %.1f queries/s", config.kind, sweep.knob, value, k, recall,
                        num_queries / seconds)  # fmt: skip
    reaching = [r for r in runs if r["recall"] >= target_recall]
    chosen = max(reaching, key=lambda r: r["queries_per_second"]) if reaching else None
    return Measured(num_queries / exact_s, runs, chosen)


def print_table(measured: Measured, k: int, path: Path) -> None:
    print(f"exact: {measured.exact_queries_per_second:,.0f} queries/s")
    for r in measured.runs:
        print(f"{r['kind']:<9} {r['knob']}={r['value']:<5} recall@{k} {r['recall']:.4f}  "
              f"{r['queries_per_second']:>9,.0f} q/s  x{r['speedup_vs_exact']:.1f} exact")  # fmt: skip
    chosen = measured.chosen
    print(f"chosen: {chosen and (chosen['kind'], chosen['knob'], chosen['value'])} -> {path}")


def size_label(n: int) -> str:
    """A catalogue size as result names give it: 1000000 -> "1m", 20000 -> "20k", 150 -> "150"."""
    return f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1_000}k" if n >= 1_000 else str(n)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/retrieval-faiss.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)

    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(s.centres, s.dim, generator=gen)
    items = clustered(s.items, centres, s.noise, gen)
    queries = clustered(s.queries, centres, s.noise, gen)
    measured = measure(items, None, queries, s.k, s.indexes, s.repeats, s.target_recall)
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
        **measured_record(measured, s.repeats),
        "settings": jsonable(asdict(s)),
        **provenance("faiss-cpu"),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print_table(measured, s.k, path)
    return path


def measured_record(measured: Measured, repeats: int) -> dict[str, Any]:
    """What a result records of a measurement: exact search, the chosen setting, every run and the timer."""
    return {
        "exact": {
            "queries_per_second": significant(measured.exact_queries_per_second),
            "impl": "ExactTopK (torch matmul + topk)",
        },
        "chosen": measured.chosen,
        "runs": measured.runs,
        "timer": timer_record(repeats),
    }


def result_name(s: Settings) -> str:
    return f"retrieval-faiss-{size_label(s.items)}" + ("-smoke" if s.smoke else "")


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
        "runs": recorded_runs(result),
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
        "timer": timer_record(settings.repeats),
        "runs": expected_runs(settings.indexes),
    }
    if "settings" in result:
        recorded |= recorded_settings(result, Settings)
        expected |= {f"settings.{key}": value for key, value in jsonable(asdict(settings)).items()}
    yield from mismatches(recorded, expected)


def recorded_runs(result: dict[str, Any]) -> list[list[Any]]:
    """[kind, knob, value, config] of every run of a result, its config read as today's `IndexConfig` (the fields
    added since it was written take their defaults)."""
    return [
        [r.get("kind"), r.get("knob"), r.get("value"), _as_index_config(r.get("config"))]
        for r in result.get("runs", [])
    ]


def expected_runs(sweeps: tuple[IndexSweep, ...]) -> list[list[Any]]:
    """[kind, knob, value, config] of every run the sweeps make."""
    return [
        [config.kind, sweep.knob, getattr(config, sweep.knob), jsonable(asdict(config))]
        for sweep in sweeps
        for config in sweep.runs()
    ]


def recorded_settings(result: dict[str, Any], settings_cls: type[Any]) -> dict[str, Any]:
    """The `settings` a result records, by `settings.<key>`, read as today's `settings_cls` (defaults filled in)."""
    try:
        settings = jsonable(asdict(config_from(settings_cls, result["settings"], "settings.")))
    except ConfigError:  # a record today's settings refuse is compared as it is: the difference shows
        settings = result["settings"]
    return {f"settings.{key}": value for key, value in settings.items()}


def _as_index_config(recorded: Any) -> Any:
    """A run's recorded config as today's `IndexConfig` records it; as it is when that refuses it."""
    try:
        return jsonable(asdict(IndexConfig(**recorded)))
    except (TypeError, ValueError):
        return recorded


def timer_record(repeats: int) -> str:
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
