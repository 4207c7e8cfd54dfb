"""FAISS retrieval benchmark: recall@k against exact search and queries per second, in one run; writes JSON.

Usage:
    .venv/bin/python benchmarks/retrieval.py            # 1M items x 64-d, 1,000 queries, k=100 (~10 min on 2 cores)
    .venv/bin/python benchmarks/retrieval.py --smoke    # 20,000 items, for a quick check

Data: synthetic unit vectors around 16,384 Gaussian centres (N(0, 1) centres, N(0, 0.6^2) noise per
coordinate: ~61 items per centre at 1M, so a query's top 100 spans several clusters), a clustered shape
like learned item embeddings, neither trivially separable (few large clusters: IVF cells then hold whole
top-100 lists) nor uniform on the sphere (ANN's worst case; `--noise 1` comes close); the queries are drawn
the same way, independently of the items. Every index is built with `recsys.retrieval.build_index` (which logs its own
recall check) and searched with the same 1,000 queries in one batch; QPS = queries / median wall time of `search` over
`--repeats` runs, exact search (`ExactTopK`, torch matmul + topk) timed the same way in the same run. The
search-time knob of each index (IVF nprobe, HNSW efSearch) is swept; `chosen` is the fastest setting that
reaches `--target-recall`. Writes benchmarks/results/retrieval-faiss-<size>.json.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, significant, versions, write_result
from recsys.retrieval import ExactTopK, IndexConfig, recall_at_k
from recsys.retrieval.faiss_index import FaissTopK, build_index

logger = logging.getLogger("benchmarks.retrieval")

# (index config, the knob swept at search time, its values)
FULL_INDEXES: list[tuple[IndexConfig, str, list[int]]] = [
    (IndexConfig(kind="ivf_flat", nlist=4096), "nprobe", [32, 64, 128, 256]),
    (IndexConfig(kind="hnsw", hnsw_m=32, ef_construction=200), "ef_search", [128, 256, 512]),
]
SMOKE_INDEXES: list[tuple[IndexConfig, str, list[int]]] = [
    (IndexConfig(kind="ivf_flat", nlist=64), "nprobe", [4, 16]),
    (IndexConfig(kind="hnsw", hnsw_m=16, ef_construction=64), "ef_search", [128]),
]


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="20,000 items instead of 1M")
    parser.add_argument("--items", type=int, help="catalog size (default 1,000,000; 20,000 with --smoke)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--centres", type=int, default=16_384, help="Gaussian centres of the synthetic vectors")
    parser.add_argument("--noise", type=float, default=0.6, help="noise sigma per coordinate around a centre")
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--target-recall", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=3, help="timed searches per setting (median)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    # force: importing torchrec (through the model registry) already put a WARNING-level handler on the root
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    num_items = args.items or (20_000 if args.smoke else 1_000_000)

    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(args.centres, args.dim, generator=gen)
    items = clustered(num_items, centres, args.noise, gen)
    queries = clustered(args.queries, centres, args.noise, gen)
    exact = ExactTopK(items)
    exact_ids = exact.search(queries, args.k)[1]
    exact_s = median_seconds(lambda: exact.search(queries, args.k), args.repeats)
    logger.info("exact: %.1f queries/s", args.queries / exact_s)

    runs = []
    for config, knob, values in SMOKE_INDEXES if args.smoke else FULL_INDEXES:
        index = build_index(items, config=config, eval_queries=queries, eval_k=args.k)
        assert index.report is not None
        for value in values:
            index.set_search_params(**{knob: value})
            recall = recall_at_k(index.search(queries, args.k)[1], exact_ids)
            seconds = median_seconds(lambda index=index: index.search(queries, args.k), args.repeats)  # type: ignore[misc]
            runs.append(_run(index, knob, value, recall, seconds, args.queries, exact_s))
            logger.info("%s %s=%d: recall@%d %.4f, %.1f queries/s", config.kind, knob, value, args.k, recall,
                        args.queries / seconds)  # fmt: skip
    reaching = [r for r in runs if r["recall"] >= args.target_recall]
    chosen = max(reaching, key=lambda r: r["queries_per_second"]) if reaching else None
    size = f"{num_items // 1_000_000}m" if num_items >= 1_000_000 else f"{num_items // 1_000}k"
    name = f"retrieval-faiss-{size}" + ("-smoke" if args.smoke else "")
    result = {
        "name": name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "data": {
            "items": num_items,
            "dim": args.dim,
            "queries": args.queries,
            "centres": 1_024,
            "noise_sigma": 0.5,
            "metric": "ip",
            "vectors": "unit-normalised",
        },
        "k": args.k,
        "target_recall": args.target_recall,
        "exact": {"queries_per_second": significant(args.queries / exact_s), "impl": "ExactTopK (torch matmul + topk)"},
        "chosen": chosen,
        "runs": runs,
        "timer": f"median wall time of {args.repeats} batched searches of all queries, after one warm-up",
        "machine": machine(),
        "versions": versions("faiss-cpu"),
        "command": command(),
    }
    path = write_result(name, result, args.results_dir)
    print(f"exact: {args.queries / exact_s:,.0f} queries/s")
    for r in runs:
        print(f"{r['kind']:<9} {r['knob']}={r['value']:<5} recall@{args.k} {r['recall']:.4f}  "
              f"{r['queries_per_second']:>9,.0f} q/s  x{r['speedup_vs_exact']:.1f} exact")  # fmt: skip
    print(f"chosen: {chosen and (chosen['kind'], chosen['knob'], chosen['value'])} -> {path}")
    return path


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
