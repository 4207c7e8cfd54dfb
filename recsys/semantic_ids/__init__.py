"""Semantic IDs: short tuples of codes learned from an LLM embedding of each item's text (TIGER).

items.parquet ──`embed_items`──▶ (N, D) content embeddings ──`fit_rqkmeans` | `train_rqvae`──▶ (N, L) codes
──`deduplicate`──▶ (N, L+1) unique codes ──`write_semantic_ids`──▶ semantic_ids.parquet + stats JSON.

Similar items share code prefixes, so a generative retriever can decode an item code by code. See
docs/semantic_ids.md for the knobs and what the health statistics mean.
"""

from recsys.semantic_ids.codes import (
    SemanticIds,
    SemanticIdStats,
    deduplicate,
    read_semantic_ids,
    semantic_id_stats,
    write_semantic_ids,
)
from recsys.semantic_ids.content import ContentConfig, embed_items, embed_texts, item_texts
from recsys.semantic_ids.rqkmeans import RQKMeans, RQKMeansConfig, fit_rqkmeans
from recsys.semantic_ids.rqvae import RQVAE, RQVAEConfig, train_rqvae

__all__ = [
    "RQVAE",
    "ContentConfig",
    "RQKMeans",
    "RQKMeansConfig",
    "RQVAEConfig",
    "SemanticIdStats",
    "SemanticIds",
    "deduplicate",
    "embed_items",
    "embed_texts",
    "fit_rqkmeans",
    "item_texts",
    "read_semantic_ids",
    "semantic_id_stats",
    "train_rqvae",
    "write_semantic_ids",
]
