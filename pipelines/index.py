"""Pipeline step `build_index`: a trained retriever's item vectors -> a FAISS index directory.

The index holds the model's item vectors (ids = the model's item indices, 1..V; the raw ids are in the model
directory's items.parquet) and is checked, as it is built, against exact search with the queries it will
serve: the user vectors of (up to) `eval_users` validation users. Idempotent: the index records the model
file's hash and the index config, and an index built from the same ones is kept as it is.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from pipelines.model_dir import load_model_dir, model_sha256
from recsys.errors import RecsysError
from recsys.inference import VectorScorer
from recsys.retrieval import IndexConfig
from recsys.retrieval.faiss_index import FaissTopK, build_index

logger = logging.getLogger(__name__)


def build_index_step(
    model_dir: Path, out_dir: Path, config: IndexConfig, eval_users: int = 1_000, model_sha: str | None = None
) -> Path:
    """Build (or keep, when up to date) the FAISS index of `model_dir`'s item vectors in `out_dir` (`model_sha`: its
    model file's SHA-256 when the caller has it; else it is computed)."""
    source = {"model_sha256": model_sha or model_sha256(model_dir), "config": dataclasses.asdict(config)}
    if FaissTopK.read_source(out_dir) == source:
        logger.info("index %s is up to date with %s: kept", out_dir, model_dir)
        return out_dir
    trained = load_model_dir(model_dir)
    model = trained.model
    if not isinstance(model, VectorScorer):
        raise RecsysError(
            f"{model_dir} holds a {trained.name} model, which has no item vectors to index (generative models "
            "retrieve by beam search, popularity by counts). Fix: build the index from a SASRec model directory"
        )
    model.eval()
    with torch.no_grad():
        vectors = model.item_embeddings()[1:].float()  # row 0 is padding
        valid = trained.data.eval_split("valid")
        rows = torch.arange(min(eval_users, len(valid.histories)))
        width = model.max_history
        histories = valid.histories.select(rows).to_padded(width)
        queries = model.encode_queries(histories, valid.user_idx[rows], valid.times(rows, width))
        queries = queries.float()
    index = build_index(vectors, torch.arange(1, vectors.shape[0] + 1), config, eval_queries=queries)
    return index.save(out_dir, source=source)
