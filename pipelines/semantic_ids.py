"""Pipeline step: item vectors (content embeddings from pipelines.content, collaborative vectors from the training
interactions, or both) -> RQ-VAE / RQ-KMeans codes -> semantic_ids.parquet.

Skipped when a previous run produced the file from the same settings and the same catalog.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from pydantic import TypeAdapter

from pipelines.config import SidSection
from recsys.data.prepared import load_prepared
from recsys.data.schema import ITEM_ID, ITEM_IDX, ITEMS_FILE
from recsys.semantic_ids.codes import (
    SEMANTIC_IDS_FILE,
    SemanticIdStats,
    deduplicate,
    read_semantic_ids,
    semantic_id_stats,
    write_semantic_ids,
)
from recsys.semantic_ids.collaborative import collaborative_vectors
from recsys.semantic_ids.content import ContentConfig, read_content_embeddings
from recsys.semantic_ids.rqkmeans import fit_rqkmeans
from recsys.semantic_ids.rqvae import train_rqvae

logger = logging.getLogger(__name__)


def build_semantic_ids_step(
    section: SidSection, content: ContentConfig, data_dir: Path, embeddings: Path | None, out_dir: Path
) -> Path:
    """Write `out_dir/semantic_ids.parquet` (+ stats JSON) for the catalog of `data_dir`; returns its path.

    Args:
        section: method, vectors and tokenizer settings.
        content: how `embeddings` were made (recorded with the semantic IDs).
        data_dir: a prepared directory (its items.parquet is the catalog).
        embeddings: the catalog's content_embeddings.npy (`pipelines.content.embed_content_step` with `content`);
            random vectors take only its dimension; None for collaborative vectors alone (`reads_text`).
        out_dir: where the semantic IDs go.
    """
    path = out_dir / SEMANTIC_IDS_FILE
    items = pl.read_parquet(data_dir / ITEMS_FILE).sort(ITEM_IDX)
    settings = sid_settings(section, content)
    fingerprint = _fingerprint(settings, items)
    if path.is_file() and read_semantic_ids(path)[0].meta.get("fingerprint") == fingerprint:
        logger.info("semantic IDs in %s are up to date; skipping", path)
        return path
    start = time.perf_counter()
    vectors = _vectors(
        section, data_dir, None if embeddings is None else read_content_embeddings(embeddings, items.height)
    )
    codes, reconstructions = _tokenize(section, vectors)
    stats = semantic_id_stats(codes, _codebook_size(section), vectors, reconstructions)
    meta = {
        "fingerprint": fingerprint,
        "method": section.method,
        "vectors": section.vectors,
        "settings": settings,
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_semantic_ids(path, items[ITEM_IDX].to_numpy(), items[ITEM_ID].to_list(), deduplicate(codes), stats, meta=meta)
    _log_stats(stats)
    return path


def reads_text(section: SidSection) -> bool:
    """Whether the semantic IDs' vectors need the content embeddings (random ones take their dimension)."""
    return section.vectors != "collaborative"


def _vectors(section: SidSection, data_dir: Path, content: np.ndarray | None) -> np.ndarray:
    """(V, D) vectors of the catalogue's items (item_idx order) as `section.vectors` says."""
    if section.vectors == "collaborative":
        return _collaborative(section, data_dir)
    assert content is not None, "every other kind of vectors reads the content embeddings"
    if section.vectors == "content":
        return content
    if section.vectors == "content_and_collaborative":
        unit = content / np.maximum(np.linalg.norm(content, axis=1, keepdims=True), 1e-12)
        return np.concatenate([unit, _collaborative(section, data_dir)], axis=1) / np.sqrt(2.0)
    rng = np.random.default_rng(section.rqvae.seed)
    x = rng.standard_normal(content.shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _collaborative(section: SidSection, data_dir: Path) -> np.ndarray:
    """Collaborative vectors of the prepared data's training sequences (what the trainer trains on: no validation or
    test target, no cold-start item)."""
    data = load_prepared(data_dir)
    return collaborative_vectors(data.training_sequences(), data.num_items, section.collaborative)


def _tokenize(section: SidSection, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, L) codes and (N, D) reconstructions of `x`."""
    if section.method == "rqkmeans":
        quantizer, codes = fit_rqkmeans(x, section.rqkmeans)
        return codes, quantizer.decode(codes)
    model, codes = train_rqvae(x, section.rqvae, section.device)
    with torch.no_grad():
        x_hat = model.decode_codes(torch.as_tensor(codes, device=next(model.parameters()).device))
    return codes, x_hat.float().cpu().numpy()


def _codebook_size(section: SidSection) -> int:
    return section.rqkmeans.codebook_size if section.method == "rqkmeans" else section.rqvae.codebook_size


def sid_settings(section: SidSection, content: ContentConfig) -> dict[str, Any]:
    """How semantic IDs are made, as their file records it: the `sid` section's settings and the `content` ones."""
    return {**section.model_dump(mode="json"), "content": TypeAdapter(ContentConfig).dump_python(content, mode="json")}


def _fingerprint(settings: dict[str, Any], items: pl.DataFrame) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    digest.update(items.write_ndjson().encode())  # JSON lines: list columns (category paths) too, unlike CSV
    return digest.hexdigest()


def _log_stats(stats: SemanticIdStats) -> None:
    logger.info("semantic-ID health: %s", stats.to_dict())
