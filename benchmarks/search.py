"""Search benchmark: BM25, dense text search, a history-only SASRec and the query-aware model on the search protocol
(docs/search.md): Recall@k / NDCG@k per query level and setting, full ranking; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.search --config benchmarks/configs/search-beauty.yaml \
        --set query_aware_model_dir=.cache/bench/models/beauty-query-aware \
        --set sasrec_model_dir=.cache/bench/models/beauty-sasrec \
        --set content_dir=.cache/bench/content/beauty-query-aware

Settings: benchmarks/configs/search-*.yaml (`--config`, `--set KEY=VALUE`). The models are the model directories
`benchmarks.quality` trains (WORK/models/<config name>); `content_dir` is the query-aware experiment's content
directory (WORK/content/<config name>: content_embeddings.npy and .json, training_queries.npz): the items' embeddings
(dense search, the neighbour-mix level's neighbours), the encoder settings queries are embedded with, and the
training queries the test queries must differ from. The data is the prepared directory the query-aware model was
trained on unless `data_dir` says otherwise. Writes benchmarks/results/<config stem>.json.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.reproduce import jsonable
from pipelines.search import query_search, search_inputs
from recsys.artifacts.model_dir import load_model_dir, load_trained_model, model_sha256, trained_data_dir
from recsys.data.schema import ITEM_IDX
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig
from recsys.evaluation.queries import LEVELS
from recsys.evaluation.search import (
    HISTORY_ONLY,
    HistoryOnly,
    SearchEvaluation,
    SearchSystem,
    TextSearch,
    evaluate_search,
)
from recsys.inference import QueryScorer
from recsys.retrieval.lexical import BM25Config, BM25Retriever
from recsys.retrieval.text import DenseTextRetriever
from recsys.semantic_ids.content import item_texts

logger = logging.getLogger("benchmarks.search")
QUERY_AWARE = "query-aware"  # the query-aware model's name among the systems compared
EXAMPLES = 3  # test queries of the first users recorded per level


@dataclass(frozen=True)
class Settings:
    """What the benchmark evaluates (benchmarks/configs/search-*.yaml)."""

    smoke: bool  # a quick check on generated data, not a measurement
    query_aware_model_dir: str  # `benchmarks.quality --config configs/<data>/query-aware.yaml`'s WORK/models/NAME
    sasrec_model_dir: str  # the history-only baseline's model directory, trained on the same catalogue
    content_dir: str  # the query-aware experiment's WORK/content/NAME (embeddings, their encoder, training queries)
    data_dir: str | None  # the prepared data; None: the one the query-aware model was trained on
    cache_dir: str | None  # the embeddings cache for the queries; None: no disk cache
    seed: int  # the query protocol's seed
    bm25: BM25Config
    eval: EvalConfig


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__)
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    qa_dir, sasrec_dir, content_dir = Path(s.query_aware_model_dir), Path(s.sasrec_model_dir), Path(s.content_dir)
    data_dir = Path(s.data_dir) if s.data_dir else trained_data_dir(qa_dir)
    trained = load_model_dir(qa_dir, data_dir)
    data, query_aware = trained.data, trained.model
    if not isinstance(query_aware, QueryScorer):
        raise ConfigError(
            f"query_aware_model_dir {qa_dir} holds a {trained.name} model. Fix: the directory of a query_aware model"
        )
    sasrec = load_trained_model(sasrec_dir, "sasrec_model_dir")[1]
    if sasrec.config.num_items != data.num_items:
        raise ConfigError(
            f"sasrec_model_dir {sasrec_dir} was trained on {sasrec.config.num_items} items, the data has "
            f"{data.num_items}. Fix: a model trained on the same catalogue (configs/<data>/sasrec.yaml)"
        )
    inputs = search_inputs(content_dir, query_aware, data, s.seed, Path(s.cache_dir) if s.cache_dir else None)
    split, queries, content_config = inputs.split, inputs.queries, inputs.encoder
    texts = item_texts(data.items.sort(ITEM_IDX), content_config.text_fields)
    systems: dict[str, SearchSystem] = {
        "bm25": TextSearch(BM25Retriever(texts, s.bm25)),
        "dense": TextSearch(DenseTextRetriever(inputs.content, inputs.embed)),
        "sasrec": HistoryOnly(sasrec.eval()),
        QUERY_AWARE: query_search(query_aware, inputs),
    }
    evaluation = evaluate_search(systems, split, queries, s.eval)
    result = {
        "data": {"data_dir": str(data_dir), "items": data.num_items, "test_users": len(split.targets)},
        "models": {
            QUERY_AWARE: {"model_dir": str(qa_dir), "model_sha256": model_sha256(qa_dir)},
            "sasrec": {"model_dir": str(sasrec_dir), "model_sha256": model_sha256(sasrec_dir)},
        },
        "content": {"content_dir": str(content_dir), "encoder": jsonable(asdict(content_config))},
        "protocol": {
            "levels": list(LEVELS),
            "seed": s.seed,
            "users": "test split (leave-one-out): each user's target, its query made from the target's title",
            "ranking": "full (all items, no sampled negatives)",
            "exclude_seen": s.eval.exclude_seen,
            "disjoint": "no test query equals one of its item's training queries",
        },
        "examples": {level: queries[level][:EXAMPLES] for level in LEVELS},
        "evaluation": evaluation.to_dict(),
        "settings": jsonable(asdict(s)),
        **provenance("bm25s", "faiss-cpu", "sentence-transformers"),
    }
    path = write_result(Path(reproduce.config).stem, result, args.results_dir, reproduce)
    print_table(evaluation, path)
    return path


def print_table(evaluation: SearchEvaluation, path: Path) -> None:
    """One row per system and setting, Recall@10 / NDCG@10 per level (history-only: the same for every level)."""
    k = 10 if 10 in evaluation.ks else evaluation.ks[0]
    rows: list[tuple[str, str, list[dict[str, float]]]] = [
        (name, HISTORY_ONLY, [metrics] * len(LEVELS)) for name, metrics in evaluation.history_only.items()
    ]
    for setting in ("history+query", "no-history"):
        names = evaluation.levels[LEVELS[0]][setting]
        rows += [(name, setting, [evaluation.levels[level][setting][name] for level in LEVELS]) for name in names]
    print(f"{'system':<12} {'setting':<14}" + "".join(f" {level + f' R@{k}/N@{k}':>26}" for level in LEVELS))
    for name, setting, per_level in rows:
        cells = "".join(f" {m[f'recall@{k}']:>12.4f} /{m[f'ndcg@{k}']:>11.4f}" for m in per_level)
        print(f"{name:<12} {setting:<14}{cells}")
    print(f"users: {evaluation.users} test, with a query: {evaluation.queried} -> {path}")


if __name__ == "__main__":
    main()
