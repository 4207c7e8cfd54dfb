"""Pipeline step `embed_content`: the prepared catalog's item text -> content embeddings (an LLM encoder).

Writes `content_embeddings.npy` ((V, D) float32, row i = item_idx i+1, L2-normalised by default) and
`content_embeddings.json` (encoder settings, item count, dim) together, atomically. The encoder's outputs are
cached per text in the shared embedding cache, so a re-run, or another experiment over the same catalog,
embeds nothing; the step is skipped outright when its file was made from the same settings and catalog.

For a model that reads text queries it also writes `training_queries.npz`: the training queries the search protocol's
query maker makes from every item's title (`recsys.evaluation.queries`), and, when switched on, the shopper queries
the enrich step's LLM wrote, embedded by the same encoder (`recsys.training.recipes.QueryBank`). The text fields may
name the enrich step's `llm_...` columns (`recsys.enrich.columns`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys.data.schema import ITEM_IDX, ITEMS_FILE
from recsys.enrich.columns import LLM_QUERIES, with_item_metadata
from recsys.errors import ConfigError, DataError
from recsys.evaluation.queries import QueryMaker, catalogue_titles, most_similar
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.json_files import read_json_object
from recsys.semantic_ids.content import ContentConfig, embed_texts, item_texts
from recsys.training.recipes import QUERIES_FILE, QueryBank, QueryTraining

logger = logging.getLogger(__name__)

CONTENT_EMBEDDINGS_FILE = "content_embeddings.npy"
CONTENT_META_FILE = "content_embeddings.json"


def embed_content_step(
    config: ContentConfig, data_dir: Path, out_dir: Path, cache_dir: Path, metadata: Path | None = None
) -> Path:
    """Embed the catalog of `data_dir` into `out_dir`; returns the path of content_embeddings.npy.

    Args:
        config: encoder (a sentence-transformers model, any local Hugging Face encoder, or a decoder LLM) and
            the text fields to embed.
        data_dir: a prepared directory (its items.parquet is the catalog).
        out_dir: where the embeddings go.
        cache_dir: the per-text embedding cache shared by experiments.
        metadata: the enrich step's item_metadata.parquet, whose `llm_...` columns `config.text_fields` may name.
    """
    items = with_item_metadata(pl.read_parquet(data_dir / ITEMS_FILE), metadata).sort(ITEM_IDX)
    texts = item_texts(items, config.text_fields)
    fingerprint = _fingerprint(config, texts)
    path = out_dir / CONTENT_EMBEDDINGS_FILE
    if path.is_file() and _read_meta(out_dir).get("fingerprint") == fingerprint:
        logger.info("content embeddings in %s are up to date; skipping", path)
        return path
    vectors = embed_texts(texts, config, cache_dir)
    meta = {"fingerprint": fingerprint, "items": items.height, "dim": int(vectors.shape[1]),
            "encoder": dataclasses.asdict(config)}  # fmt: skip
    with atomic_directory(out_dir, marker=CONTENT_EMBEDDINGS_FILE) as tmp:
        np.save(tmp / CONTENT_EMBEDDINGS_FILE, vectors.astype(np.float32, copy=False))
        (tmp / CONTENT_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    logger.info("embedded %d items (dim %d) into %s", items.height, vectors.shape[1], path)
    return path


def _fingerprint(config: ContentConfig, texts: list[str]) -> str:
    joined = "\n".join(texts)
    return hashlib.sha256(f"{config.cache_key}|normalize={config.normalize}\n{joined}".encode()).hexdigest()


def _read_meta(out_dir: Path) -> dict:
    """content_embeddings.json; {} (the content embedded again) when there is none or it does not read."""
    meta_path = out_dir / CONTENT_META_FILE
    if not meta_path.is_file():
        return {}
    try:
        return read_json_object(meta_path, "none needed")
    except DataError as err:  # what a crash or a full disk left: embedded again, not kept
        logger.warning("%s: %s: the content is embedded again", err.path, err.problem)
        return {}


def embed_training_queries(
    config: ContentConfig, settings: QueryTraining, data_dir: Path, out_dir: Path, cache_dir: Path,
    metadata: Path | None = None,
) -> Path:  # fmt: skip
    """Make `settings.queries_per_item` training queries of every item of `data_dir` from its title (the
    neighbour-mix level's neighbours: the most similar content embeddings, already in `out_dir`), add its LLM-written
    shopper queries when `settings.llm_queries` (from `metadata`, the enrich step's records), and embed them with the
    content encoder into `out_dir`/training_queries.npz; returns its path."""
    if config.decoder:
        raise ConfigError(
            "a model that reads queries embeds them as its items' text, with a sentence encoder; content.decoder is "
            "true. Fix: set it to false (a sentence-transformers model, the default all-MiniLM-L6-v2)"
        )
    items = pl.read_parquet(data_dir / ITEMS_FILE).sort(ITEM_IDX)
    titles = catalogue_titles(items)
    neighbours = most_similar(np.load(out_dir / CONTENT_EMBEDDINGS_FILE))
    maker = QueryMaker(titles, neighbours, settings.query_seed)
    made = maker.training_queries(range(1, len(titles)), settings.queries_per_item)
    if settings.llm_queries:
        if metadata is None:
            raise ConfigError(
                "model.training.llm_queries is true, and no enrich step wrote item metadata. Fix: add an `enrich` "
                "section to the config (docs/enrich.md), or set llm_queries: false"
            )
        written = with_item_metadata(items, metadata)[LLM_QUERIES].to_list()  # row 0 is item 1
        for item in range(1, len(titles)):
            known = set(made[item])
            made[item] = [*made[item], *(q for q in written[item - 1] or () if q not in known)]
    texts = [q for item in range(1, len(titles)) for q in made[item]]
    counts = torch.tensor([0, 0, *(len(made[item]) for item in range(1, len(titles)))])
    vectors = embed_texts(texts, config, cache_dir) if texts else np.zeros((0, 1), dtype=np.float32)
    bank = QueryBank(
        torch.from_numpy(vectors.astype(np.float32, copy=False)), torch.cumsum(counts, dim=0), tuple(texts)
    )
    path = out_dir / QUERIES_FILE
    out_dir.mkdir(parents=True, exist_ok=True)
    bank.save(path)
    logger.info("made and embedded %d training queries of %d items into %s", len(texts), items.height, path)
    return path
