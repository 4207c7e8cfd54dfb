"""The search evaluation on the tiny synthetic data: each system in the settings it reads, per query level, users
without a query left out of that level, the numbers those of ranking each setting's scores by hand, and the
history-only adapter giving the model's plain evaluation numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recsys.data.prepared import EvalSplit, SequenceData, load_prepared
from recsys.evaluation import EvalConfig, evaluate, ranking_metrics, target_ranks
from recsys.evaluation.queries import LEVELS, QueryMaker, catalogue_titles, most_similar
from recsys.evaluation.search import (
    HistoryOnly,
    QuerySearch,
    SearchSystem,
    TextSearch,
    evaluate_search,
    level_queries,
)
from recsys.models.query_aware import QueryAwareConfig, QueryAwareRetriever
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.retrieval.lexical import BM25Retriever
from recsys.retrieval.text import QueryEmbedder
from recsys.semantic_ids.content import ContentConfig, embed_texts

CONFIG = EvalConfig(ks=(5, 10), batch_size=64)
CONTENT = ContentConfig(text_fields=("title",), progress=False)


@pytest.fixture(scope="module")
def data(tiny_data_dir: Path) -> SequenceData:
    return load_prepared(tiny_data_dir)


@pytest.fixture(scope="module")
def embed() -> QueryEmbedder:
    return QueryEmbedder(CONTENT)


def sasrec(num_items: int) -> SASRec:
    torch.manual_seed(0)
    return SASRec(SASRecConfig(num_items, max_history=10, dim=16, num_heads=1, ffn_dim=32)).eval()


def query_aware(num_items: int, content: torch.Tensor, titles: list[str]) -> QueryAwareRetriever:
    torch.manual_seed(0)
    config = QueryAwareConfig(num_items, max_history=10, dim=16, num_heads=1, ffn_dim=32, content_dim=content.shape[1])
    return QueryAwareRetriever(config, torch.cat([torch.zeros(1, content.shape[1]), content]), titles).eval()


def by_hand(scores: torch.Tensor, split: EvalSplit, rows: torch.Tensor) -> dict[str, float]:
    scores[:, 0] = -torch.inf
    return ranking_metrics(target_ranks(scores, split.targets[rows]), CONFIG.ks)


def test_the_history_only_adapter_gives_the_models_plain_evaluation(data: SequenceData) -> None:
    model, split = sasrec(data.num_items), data.eval_split("test")
    queries = {level: [""] * len(split.targets) for level in LEVELS}
    found = evaluate_search({"sasrec": HistoryOnly(model)}, split, queries, CONFIG)
    plain = evaluate(model, split, data.num_items, CONFIG).metrics
    assert found.history_only["sasrec"] == {key: plain[key] for key in found.history_only["sasrec"]}
    assert found.queried == dict.fromkeys(LEVELS, 0) and all(not s["no-history"] for s in found.levels.values())


def test_every_setting_and_level_ranks_the_users_with_a_query(data: SequenceData, embed: QueryEmbedder) -> None:
    titles = catalogue_titles(data.items)
    content = torch.from_numpy(embed_texts(titles[1:], CONTENT, encoder=embed.encoder))
    split = data.eval_split("test")
    queries = level_queries(QueryMaker(titles, most_similar(content.numpy()), seed=0), split)
    queries["title-3"][:5] = [""] * 5  # five users without a query at this level
    bm25, unified = BM25Retriever(titles[1:]), query_aware(data.num_items, content, titles[1:])
    systems: dict[str, SearchSystem] = {"bm25": TextSearch(bm25), "sasrec": HistoryOnly(sasrec(data.num_items)),
               "query-aware": QuerySearch(unified, embed)}  # fmt: skip
    found = evaluate_search(systems, split, queries, CONFIG)

    users = len(split.targets)
    assert found.users == users and found.queried["title-3"] == users - 5
    assert set(found.history_only) == {"sasrec", "query-aware"}
    for level in LEVELS:
        assert set(found.levels[level]["history+query"]) == {"query-aware"}
        assert set(found.levels[level]["no-history"]) == {"bm25", "query-aware"}
    rows = torch.arange(5, users)
    texts = queries["title-3"][5:]
    assert found.levels["title-3"]["no-history"]["bm25"] == pytest.approx(by_hand(bm25.score(texts), split, rows))
    with torch.no_grad():
        search = unified.score_with_queries(torch.zeros(len(rows), 0, dtype=torch.long), embed(texts), texts)
        both = unified.score_with_queries(split.histories.select(rows).to_padded(10), embed(texts), texts)
    setting = found.levels["title-3"]
    assert setting["no-history"]["query-aware"] == pytest.approx(by_hand(search, split, rows), abs=1e-6)
    assert setting["history+query"]["query-aware"] == pytest.approx(by_hand(both, split, rows), abs=1e-6)
    assert setting["no-history"]["bm25"]["recall@10"] > 0.5  # three title words find the item


def test_queries_must_match_the_users(data: SequenceData) -> None:
    split = data.eval_split("test")
    with pytest.raises(ValueError, match="one query per user"):
        evaluate_search({"sasrec": HistoryOnly(sasrec(data.num_items))}, split, {"title-3": ["lipstick"]}, CONFIG)
