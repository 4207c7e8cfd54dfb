"""BM25 over the items' text (the `bm25s` library): the lexical search baseline of docs/search.md.

Tokenisation is bm25s' own and deterministic: lower case, the words of scikit-learn's pattern (two or more word
characters), no stemming, and bm25s' English stopword list (`STOPWORDS_EN`, 33 words: "a", "for", "with", "the", ...).
Those words fill product titles ("Cream for Men with Aloe") and carry no item: kept, a query word "for" would score
every such title. Queries are tokenised with the same rules against the catalogue's vocabulary; a query word the
catalogue never uses scores nothing.

Scores follow the platform's convention for a whole catalogue: (B, V+1), column 0 (the padding item) -inf, so that
`recsys.evaluation` ranks them as it ranks a model's. A query that matches no item scores every item 0 (all tied).

Dimension letters: B queries, V items, k results per query.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from recsys.retrieval.base import check_query_texts

logger = logging.getLogger(__name__)


def _bm25s() -> ModuleType:
    """bm25s, imported on first use. Where JAX is installed, bm25s runs it at import, and JAX on a GPU takes 75 % of
    the GPU's memory up front (XLA's preallocation), starving a model that trains beside it; BM25's top-k needs no
    GPU, so JAX stays on the CPU unless the caller chose its platform (JAX_PLATFORMS)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return importlib.import_module("bm25s")


@dataclass(frozen=True)
class BM25Config:
    k1: float = 1.5  # term-frequency saturation (bm25s' default)
    b: float = 0.75  # length normalisation (bm25s' default)
    method: str = "lucene"  # bm25s' BM25 variant ("robertson", "lucene", "atire", "bm25l", "bm25+")
    stopwords: str | None = "en"  # bm25s' English list, or None for none


class BM25Retriever:
    """BM25 scores of every item for text queries.

    Args:
        texts: (V,) the text of items 1..V (row i = item index i + 1, as `recsys.semantic_ids.content.item_texts`
            gives it for items.parquet sorted by item_idx).
        config: BM25's parameters and the stopwords.

    Example:
        >>> bm25 = BM25Retriever(["Red Lipstick Matte", "Blue Eye Shadow", "Lipstick Brush"])
        >>> bm25.search(["red lipstick"], k=2)[1].tolist()
        [[1, 3]]
    """

    def __init__(self, texts: Sequence[str], config: BM25Config = BM25Config()) -> None:
        if not texts:
            raise ValueError("BM25 needs the items' texts (got none). Fix: pass one text per item of the catalogue")
        self.config = config
        self.num_items = len(texts)  # V
        self.model = _bm25s().BM25(k1=config.k1, b=config.b, method=config.method)
        self.model.index(self._tokens(texts), show_progress=False)
        logger.info("BM25 over %d items, %d distinct words", self.num_items, len(self.model.vocab_dict) - 1)

    def _tokens(self, texts: Sequence[str]) -> list[list[str]]:
        tokens = _bm25s().tokenize(list(texts), stopwords=self.config.stopwords, return_ids=False, show_progress=False)
        return [list(words) for words in tokens]

    def score(self, queries: Sequence[str]) -> torch.Tensor:
        """(B,) query texts -> (B, V+1) float32 BM25 scores, column 0 (padding) -inf."""
        check_query_texts(queries)
        out = torch.full((len(queries), self.num_items + 1), float("-inf"))
        for row, words in enumerate(self._tokens(queries)):
            ids = self.model.get_tokens_ids(words)  # words the catalogue never uses are dropped
            out[row, 1:] = torch.from_numpy(self.model.get_scores_from_ids(ids)) if ids else 0.0
        return out

    def search(self, queries: Sequence[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) query texts -> (scores (B, k) float32, item_idx (B, k) int64), best first (ties: lower item first)."""
        if not 1 <= k <= self.num_items:
            raise ValueError(f"k must be in [1, {self.num_items}] (the number of items), got {k}")
        scores, ids = torch.sort(self.score(queries), dim=1, descending=True, stable=True)  # ties: lower item first
        return scores[:, :k], ids[:, :k]
