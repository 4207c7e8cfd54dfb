"""Dense text search: queries embedded by the content encoder (`recsys.semantic_ids.content`, MiniLM by default)
against the items' content embeddings, through a FAISS Flat inner-product index over L2-normalised vectors (cosine),
the dense baseline of docs/search.md.

`QueryEmbedder` turns query texts into the vectors the items' content was embedded as (the same `ContentConfig`:
encoder, normalisation); a query-aware model reads its queries through it too. Scores follow the platform's
convention for a whole catalogue: (B, V+1), column 0 (the padding item) -inf.

Dimension letters: B queries, C content (encoder) dim, V items, k results per query.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from recsys.retrieval.base import check_query_texts
from recsys.retrieval.config import IndexConfig
from recsys.retrieval.faiss_index import build_index
from recsys.semantic_ids.content import ContentConfig, embed_texts, load_encoder

logger = logging.getLogger(__name__)


class QueryEmbedder:
    """Query texts -> (B, C) float32 vectors, by the encoder of `config` (loaded once).

    Every distinct text is embedded once per embedder (an evaluation asks the same queries in several settings); the
    on-disk cache of `embed_texts` is used too when `cache_dir` is given.

    Args:
        config: the encoder and normalisation the items' content was embedded with.
        cache_dir: the embeddings cache folder; None caches on disk nothing.
    """

    def __init__(self, config: ContentConfig, cache_dir: Path | None = None) -> None:
        self.config, self.cache_dir = config, cache_dir
        self.encoder = load_encoder(config)
        self._vectors: dict[str, np.ndarray] = {}

    def __call__(self, queries: Sequence[str]) -> torch.Tensor:
        check_query_texts(queries)
        new = list(dict.fromkeys(q for q in queries if q not in self._vectors))
        if new:
            vectors = embed_texts(new, self.config, self.cache_dir, encoder=self.encoder)  # (n, C)
            self._vectors.update(zip(new, vectors, strict=True))
        return torch.from_numpy(np.stack([self._vectors[q] for q in queries]))


class DenseTextRetriever:
    """Cosine similarity of query and item text embeddings, searched in a FAISS Flat (exact) inner-product index.

    Args:
        content: (V, C) the items' content embeddings, row i = item index i + 1 (content_embeddings.npy); normalised
            here (a no-op for the pipeline's, which are).
        embed: the query embedder of the encoder that made `content`.
    """

    def __init__(self, content: np.ndarray | torch.Tensor, embed: QueryEmbedder) -> None:
        items = torch.nn.functional.normalize(torch.as_tensor(content, dtype=torch.float32), dim=1)  # (V, C)
        self.embed = embed
        self.num_items = len(items)  # V
        ids = torch.arange(1, self.num_items + 1)  # item_idx of each row
        self.index = build_index(
            items, ids, IndexConfig(kind="flat", metric="ip", device="cpu"), eval_k=min(100, self.num_items)
        )

    def search(self, queries: Sequence[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) query texts -> (scores (B, k) float32 cosine, item_idx (B, k) int64), best first."""
        vectors = torch.nn.functional.normalize(self.embed(queries), dim=1)  # (B, C)
        return self.index.search(vectors, k)

    def score(self, queries: Sequence[str]) -> torch.Tensor:
        """(B,) query texts -> (B, V+1) float32 cosine of every item, column 0 (padding) -inf: the index searched
        for all V items (Flat: exact)."""
        scores, ids = self.search(queries, self.num_items)  # (B, V) each
        out = torch.full((len(queries), self.num_items + 1), float("-inf"))
        return out.scatter_(1, ids, scores)
