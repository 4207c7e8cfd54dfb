"""Pipeline step `build_index`: a trained retriever's item vectors -> a FAISS index directory.

The index holds the model's item vectors (ids = the model's item indices, 1..V; the raw ids are in the model
directory's items.parquet) and is checked, as it is built, against exact search with the queries it will
serve: the user vectors of a seeded sample of (up to) `eval_users` validation users. Idempotent: the index records
the model file's hash and the index config, and an index built from the same ones is kept as it is.

Dimension letters: V items, D vector dim, B users.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from recsys.artifacts.model_dir import TrainedModel, load_model_dir, model_sha256
from recsys.data.prepared import SequenceData
from recsys.errors import RecsysError
from recsys.inference import VectorScorer
from recsys.retrieval import IndexConfig
from recsys.retrieval.faiss_index import FaissTopK, build_index

logger = logging.getLogger(__name__)
ENCODE_BATCH = 1_024  # users encoded per model call


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
    model = vector_model(trained, model_dir)
    vectors, ids = item_vectors(model)
    queries = user_queries(model, trained.data, eval_users, config.seed)
    index = build_index(vectors, ids, config, eval_queries=queries)
    return index.save(out_dir, source=source)


def vector_model(trained: TrainedModel, model_dir: Path) -> VectorScorer:
    """The trained model, in eval mode, as a scorer with item vectors; `RecsysError` with the fix for one without."""
    model = trained.model
    if not isinstance(model, VectorScorer):
        raise RecsysError(
            f"{model_dir} holds a {trained.name} model, which has no item vectors to index (generative models "
            "retrieve by beam search, popularity by counts). Fix: build the index from a SASRec model directory"
        )
    model.eval()
    return model


@torch.no_grad()
def item_vectors(model: VectorScorer) -> tuple[torch.Tensor, torch.Tensor]:
    """(V, D) fp32 item vectors without the padding row, and their (V,) ids: the item indices 1..V."""
    vectors = model.item_embeddings()[1:].detach().float()
    return vectors, torch.arange(1, vectors.shape[0] + 1)


@torch.no_grad()
def user_queries(model: VectorScorer, data: SequenceData, num_users: int, seed: int) -> torch.Tensor:
    """(B, D) fp32 query vectors of a seeded sample of B = min(`num_users`, U) validation users: what the model
    encodes from each one's history before its validation item (the queries an index of its items serves)."""
    valid = data.eval_split("valid")
    total = len(valid.histories)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(total, generator=gen)[: min(num_users, total)].sort().values
    width = model.max_history
    chunks = []
    for batch in rows.split(ENCODE_BATCH):
        histories = valid.histories.select(batch).to_padded(width)  # (b, L)
        chunks.append(model.encode_queries(histories, valid.user_idx[batch], valid.times(batch, width)).float())
    return torch.cat(chunks)
