"""FAISS indexes behind the `TopK` interface: Flat, IVF-Flat, HNSW and IVF-PQ, with their knobs.

`build_index` trains and fills an index, then measures its recall@k against exact search on a sample of
queries and logs it (and keeps it in `FaissTopK.report`), so an index is never used without knowing how
much it loses. On a faiss build with GPUs, `device: auto` moves IVF / Flat indexes to the GPU (FAISS has
no GPU HNSW: it stays on CPU, logged). Saved as a directory (index.faiss, ids.npy, index.json), atomically.

Dimension letters: B queries, D vector dim, V items, k results per query.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch

from recsys.retrieval.base import check_item_vectors, check_queries
from recsys.retrieval.config import IndexConfig
from recsys.retrieval.exact import ExactTopK
from recsys.retrieval.recall import recall_at_k
from recsys.runtime.atomic import atomic_directory

INDEX_FILE = "index.faiss"
logger = logging.getLogger(__name__)

_METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
_MARKER = "index.json"


@dataclass(frozen=True)
class BuildReport:
    """What building cost and how close the index is to exact search (recall@k on `eval_queries` queries)."""

    kind: str
    num_items: int
    dim: int
    device: str
    build_seconds: float
    k: int
    eval_queries: int
    recall: float


class FaissTopK:
    """A built FAISS index and the ids of its vectors; `search` follows the `TopK` interface."""

    def __init__(self, index: Any, ids: torch.Tensor, config: IndexConfig, report: BuildReport | None = None) -> None:
        self.index, self.ids, self.config, self.report = index, ids, config, report
        self.set_search_params(nprobe=config.nprobe, ef_search=config.ef_search)

    @property
    def num_items(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def set_search_params(self, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change the search-time knobs (IVF `nprobe`, HNSW `ef_search`) of the built index."""
        if nprobe is not None and self.config.kind in ("ivf_flat", "ivf_pq"):
            faiss.ParameterSpace().set_index_parameter(self.index, "nprobe", nprobe)
            self.config = dataclasses.replace(self.config, nprobe=nprobe)
        if ef_search is not None and self.config.kind == "hnsw":
            faiss.ParameterSpace().set_index_parameter(self.index, "efSearch", ef_search)
            self.config = dataclasses.replace(self.config, ef_search=ef_search)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_queries(queries, k, self.dim, self.num_items)
        if self.config.kind == "hnsw" and self.config.ef_search < k:  # HNSW cannot return more than efSearch
            faiss.ParameterSpace().set_index_parameter(self.index, "efSearch", k)
        x = np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32)
        distances, positions = self.index.search(x, k)
        positions_t = torch.from_numpy(positions)
        found = positions_t >= 0
        ids = torch.where(found, self.ids[positions_t.clamp(min=0)], torch.full_like(positions_t, -1))
        scores = torch.from_numpy(distances if self.config.metric == "ip" else -distances)
        scores = torch.where(found, scores, torch.full_like(scores, -math.inf))
        if self.config.kind == "hnsw" and self.config.ef_search < k:
            faiss.ParameterSpace().set_index_parameter(self.index, "efSearch", self.config.ef_search)
        return scores, ids

    def save(self, out_dir: Path, source: dict[str, Any] | None = None) -> Path:
        """Write index.faiss, ids.npy and index.json (config, report, `source`) into `out_dir`, atomically.

        Args:
            source: what the vectors came from (e.g. a model fingerprint), kept in index.json for callers
                that rebuild only when it changes (`read_source`).
        """
        with atomic_directory(out_dir, marker=_MARKER) as tmp:
            cpu_index = faiss.index_gpu_to_cpu(self.index) if _on_gpu(self.index) else self.index
            faiss.write_index(cpu_index, str(tmp / INDEX_FILE))
            np.save(tmp / "ids.npy", self.ids.numpy())
            meta = {
                "config": dataclasses.asdict(self.config),
                "report": self.report and dataclasses.asdict(self.report),
                "source": source or {},
            }
            (tmp / _MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        return out_dir

    @staticmethod
    def read_source(index_dir: Path) -> dict[str, Any] | None:
        """The `source` an index directory was saved with, or None when there is no index there."""
        meta = _read_meta(index_dir)
        return None if meta is None else dict(meta.get("source", {}))

    @staticmethod
    def read_report(index_dir: Path) -> BuildReport | None:
        """The build report of an index directory (without loading the index), or None."""
        meta = _read_meta(index_dir)
        return BuildReport(**meta["report"]) if meta and meta["report"] else None

    @classmethod
    def load(cls, index_dir: Path) -> FaissTopK:
        meta_path = index_dir / _MARKER
        if not meta_path.exists():
            raise FileNotFoundError(f"{index_dir} holds no FAISS index ({_MARKER} missing): build one with build_index")
        meta = json.loads(meta_path.read_text())
        config = IndexConfig(**meta["config"])
        index = _to_device(faiss.read_index(str(index_dir / INDEX_FILE)), config)
        report = BuildReport(**meta["report"]) if meta["report"] else None
        return cls(index, torch.from_numpy(np.load(index_dir / "ids.npy")), config, report)


def build_index(
    vectors: torch.Tensor,
    ids: torch.Tensor | None = None,
    config: IndexConfig | None = None,
    *,
    eval_queries: torch.Tensor | None = None,
    eval_k: int = 100,
    num_eval_queries: int = 1_000,
) -> FaissTopK:
    """Train and fill a FAISS index over (V, D) `vectors`, then measure and log its recall@k against exact search.

    Args:
        vectors: (V, D) item vectors.
        ids: (V,) int64 item ids; None = 0..V-1.
        config: the index; None = `IndexConfig()`.
        eval_queries: (B, D) queries for the recall check; None = `num_eval_queries` item vectors drawn with
            the config's seed (each finds itself, the rest of its top-k is the real test).
        eval_k: k of the recall check (at most V).
    """
    config = config or IndexConfig()
    ids = check_item_vectors(vectors, ids)
    x = np.ascontiguousarray(vectors.detach().cpu().numpy(), dtype=np.float32)
    num_items, dim = x.shape
    start = time.perf_counter()
    index = _to_device(
        faiss.index_factory(dim, _factory_string(config, num_items, dim), _METRICS[config.metric]), config
    )
    if config.kind == "hnsw":
        faiss.downcast_index(index).hnsw.efConstruction = config.ef_construction  # type: ignore[attr-defined]
    if not index.is_trained:
        index.train(_training_sample(x, config, num_items))
    index.add(x)
    built = FaissTopK(index, ids, config)
    build_seconds = time.perf_counter() - start

    rng = np.random.default_rng(config.seed)
    if eval_queries is None:
        eval_queries = torch.from_numpy(x[rng.choice(num_items, min(num_eval_queries, num_items), replace=False)])
    k = min(eval_k, num_items)
    exact_ids = ExactTopK(torch.from_numpy(x), ids, config.metric).search(eval_queries, k)[1]
    recall = recall_at_k(built.search(eval_queries, k)[1], exact_ids)
    device = "gpu" if _on_gpu(index) else "cpu"
    built.report = BuildReport(
        config.kind, num_items, dim, device, round(build_seconds, 3), k, len(eval_queries), recall
    )
    logger.info(
        "FAISS %s over %d items (D=%d, %s): recall@%d %.4f vs exact on %d queries; built in %.1f s",
        config.kind, num_items, dim, device, k, recall, len(eval_queries), build_seconds,
    )  # fmt: skip
    return built


def _read_meta(index_dir: Path) -> dict[str, Any] | None:
    meta_path = index_dir / _MARKER
    return dict(json.loads(meta_path.read_text())) if meta_path.exists() else None


def _factory_string(config: IndexConfig, num_items: int, dim: int) -> str:
    if config.kind == "flat":
        return "Flat"
    if config.kind == "hnsw":
        return f"HNSW{config.hnsw_m}"
    nlist = _nlist(config, num_items)
    if config.kind == "ivf_flat":
        return f"IVF{nlist},Flat"
    if dim % config.pq_m:
        raise ValueError(f"pq_m={config.pq_m} must divide the vector dim {dim}: pick a divisor of {dim}")
    return f"IVF{nlist},PQ{config.pq_m}x{config.pq_nbits}"


def _nlist(config: IndexConfig, num_items: int) -> int:
    if config.nlist is not None:
        if not 1 <= config.nlist <= num_items:
            raise ValueError(f"nlist must be in [1, V={num_items}], got {config.nlist}")
        return config.nlist
    return max(1, min(int(4 * math.sqrt(num_items)), num_items // 39))


def _training_sample(x: np.ndarray, config: IndexConfig, num_items: int) -> np.ndarray:
    nlist = _nlist(config, num_items)
    size = min(num_items, config.train_size or 64 * nlist)
    if config.kind == "ivf_pq":  # the PQ codebooks need 2**nbits points too
        size = min(num_items, max(size, 2**config.pq_nbits * 39))
    if size == num_items:
        return x
    rows = np.random.default_rng(config.seed).choice(num_items, size, replace=False)
    return np.ascontiguousarray(x[np.sort(rows)])


def _to_device(index: Any, config: IndexConfig) -> Any:
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if config.device == "gpu" and gpus == 0:
        raise ValueError("device: gpu, but the installed faiss has no GPUs: install faiss-gpu, or use device: cpu")
    if config.device == "gpu" and config.kind == "hnsw":
        raise ValueError("FAISS has no GPU HNSW: use kind ivf_flat / ivf_pq / flat on the GPU, or device: cpu")
    if config.device == "cpu" or gpus == 0:
        return index
    if config.kind == "hnsw":
        logger.info("FAISS HNSW stays on CPU (FAISS has no GPU HNSW)")
        return index
    return faiss.index_cpu_to_all_gpus(index)


def _on_gpu(index: Any) -> bool:
    return "Gpu" in type(index).__name__
