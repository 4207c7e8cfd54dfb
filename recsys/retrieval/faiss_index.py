"""FAISS indexes behind the `TopK` interface: Flat, IVF-Flat, HNSW and IVF-PQ (8-bit, or 4-bit fast-scan codes,
optionally re-ranked by exact scores), with their knobs.

`build_index` trains an index on a sample of the vectors, adds them in chunks within a time budget, then measures
its recall@k against exact search on a sample of queries and logs it (and keeps it in `FaissTopK.report`), so an
index is never used without knowing how much it loses. On a faiss build with GPUs, `device: auto` moves IVF / Flat
indexes to the GPU (FAISS has no GPU HNSW, fast-scan or refine index: those stay on CPU, logged). Saved as a
directory (index.faiss, ids.npy, index.json), atomically.

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
from pydantic import BaseModel, ConfigDict

from recsys.errors import DataError
from recsys.retrieval.base import Metric, check_item_vectors, check_queries
from recsys.retrieval.config import INDEX_FILE, IndexConfig
from recsys.retrieval.exact import ExactTopK
from recsys.retrieval.recall import recall_at_k
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.budget import Budget, limit
from recsys.runtime.json_files import read_json_shaped
from recsys.runtime.progress import Progress

ADD_CHUNK = 65_536  # vectors per `index.add` call: the build budget is checked (and progress logged) between chunks
BUDGET_KNOB = "max_build_seconds (pipeline.index.max_build_seconds in an experiment config)"
CHEAPER = "build a cheaper index (a smaller train_size, hnsw_m or ef_construction; kind ivf_pq with fast_scan)"
logger = logging.getLogger(__name__)

_METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
_MARKER = "index.json"
REBUILD = (
    "build the index again (`recsys index build --model-dir MODEL_DIR --out DIR`, or the pipeline's build_index step)"
)


class _IndexMeta(BaseModel):
    """What is read of an index.json (the settings, the build report, the MIPS bound, the source)."""

    model_config = ConfigDict(extra="allow")

    config: dict[str, Any]
    report: dict[str, Any] | None
    norm_bound: float | None = None
    source: dict[str, Any] = {}


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
    train_vectors: int | None = None  # the training sample (0: the kind needs none; None: built before it was kept)


class FaissTopK:
    """A built FAISS index and the ids of its vectors; `search` follows the `TopK` interface."""

    def __init__(
        self,
        index: Any,
        ids: torch.Tensor,
        config: IndexConfig,
        report: BuildReport | None = None,
        norm_bound: float | None = None,
    ) -> None:
        """`norm_bound`: with `config.mips_to_l2`, the M of the vectors' extra coordinate sqrt(M^2 - |x|^2)."""
        self.index, self.ids, self.config, self.report, self.norm_bound = index, ids, config, report, norm_bound
        self.set_search_params(nprobe=config.nprobe, ef_search=config.ef_search, refine_k_factor=config.refine_k_factor)

    @property
    def num_items(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        """The dimension of the vectors searched for (the index holds one more with `mips_to_l2`)."""
        return int(self.index.d) - (self.norm_bound is not None)

    @property
    def metric(self) -> Metric:
        return self.config.metric

    def set_search_params(
        self, *, nprobe: int | None = None, ef_search: int | None = None, refine_k_factor: float | None = None
    ) -> None:
        """Change the search-time knobs (IVF `nprobe`, HNSW `ef_search`, a refined index's `refine_k_factor`) of the
        built index; a knob the index does not have is left alone."""
        if nprobe is not None and self.config.kind in ("ivf_flat", "ivf_pq"):
            faiss.ParameterSpace().set_index_parameter(self.index, "nprobe", nprobe)
            self.config = dataclasses.replace(self.config, nprobe=nprobe)
        if ef_search is not None and self.config.kind == "hnsw":
            faiss.ParameterSpace().set_index_parameter(self.index, "efSearch", ef_search)
            self.config = dataclasses.replace(self.config, ef_search=ef_search)
        if refine_k_factor is not None and self.config.refine_k_factor is not None:
            faiss.ParameterSpace().set_index_parameter(self.index, "k_factor_rf", refine_k_factor)
            self.config = dataclasses.replace(self.config, refine_k_factor=refine_k_factor)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_queries(queries, k, self.dim, self.num_items)
        if self.config.kind == "hnsw" and self.config.ef_search < k:  # HNSW cannot return more than efSearch
            faiss.ParameterSpace().set_index_parameter(self.index, "efSearch", k)
        x = np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32)
        if self.norm_bound is not None:  # |q - [x, e]|^2 = |q|^2 + M^2 - 2 q.x: back to inner products below
            x = np.hstack([x, np.zeros((len(x), 1), dtype=np.float32)])
        distances, positions = self.index.search(x, k)
        positions_t = torch.from_numpy(positions)
        found = positions_t >= 0
        ids = torch.where(found, self.ids[positions_t.clamp(min=0)], torch.full_like(positions_t, -1))
        if self.norm_bound is not None:
            distances = ((x * x).sum(1, keepdims=True) + self.norm_bound**2 - distances) / 2
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
                "norm_bound": self.norm_bound,
                "source": source or {},
            }
            (tmp / _MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        return out_dir

    @staticmethod
    def read_source(index_dir: Path) -> dict[str, Any] | None:
        """The `source` an index directory was saved with, or None when there is no index there."""
        try:
            meta = _read_meta(index_dir)
        except DataError as err:  # what a crash or a full disk left: rebuilt, not kept
            logger.warning("%s: the index there is rebuilt", err)
            return None
        return None if meta is None else dict(meta.get("source", {}))

    @staticmethod
    def read_report(index_dir: Path) -> BuildReport | None:
        """The build report of an index directory (without loading the index), or None."""
        meta = _read_meta(index_dir)
        return _build_report(index_dir, meta["report"]) if meta and meta["report"] else None

    @classmethod
    def load(cls, index_dir: Path) -> FaissTopK:
        meta_path = index_dir / _MARKER
        if not meta_path.exists():
            raise FileNotFoundError(f"{index_dir} holds no FAISS index ({_MARKER} missing): build one with build_index")
        meta = _read_meta(index_dir)
        assert meta is not None
        try:
            config = IndexConfig(**meta["config"])
        except (TypeError, ValueError) as err:  # keys of another version, settings out of bounds
            raise DataError(meta_path, f"its index settings do not read ({err})", REBUILD) from err
        report = _build_report(index_dir, meta["report"]) if meta["report"] else None
        index = _read_index(index_dir / INDEX_FILE)
        ids = _read_ids(index_dir / "ids.npy", index.ntotal)
        return cls(_to_device(index, config), ids, config, report, meta.get("norm_bound"))


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

    The index is trained on `config.train_size` sampled vectors, then filled `ADD_CHUNK` vectors at a time; when
    `config.max_build_seconds` passes (checked after training and after each chunk) the build stops with
    `recsys.errors.BudgetExceeded` naming that knob: no partial index is returned.

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
    what = f"building the {_describe(config)} index of {num_items:,} vectors"
    budget = Budget(what, seconds=limit(config.max_build_seconds, BUDGET_KNOB, CHEAPER)).start()
    start = time.perf_counter()
    held, norm_bound = (x, None) if not config.mips_to_l2 else _with_norm_coordinate(x)
    metric = faiss.METRIC_L2 if config.mips_to_l2 else _METRICS[config.metric]
    index = _to_device(
        faiss.index_factory(held.shape[1], _factory_string(config, num_items, held.shape[1]), metric), config
    )
    if config.kind == "hnsw":
        faiss.downcast_index(index).hnsw.efConstruction = config.ef_construction  # type: ignore[attr-defined]
    train_vectors = 0
    if not index.is_trained:
        sample = _training_sample(held, config, num_items)
        index.train(sample)
        train_vectors = len(sample)
        budget.check(f"after training on {train_vectors:,} sampled vectors")
    progress = Progress(logger, what, total=num_items, unit="vectors", rows_are="vectors")
    for first in range(0, num_items, ADD_CHUNK):
        chunk = held[first : first + ADD_CHUNK]
        index.add(chunk)
        progress.update(done=first + len(chunk), rows=len(chunk))
        budget.check(f"after adding {first + len(chunk):,} of {num_items:,} vectors")
    built = FaissTopK(index, ids, config, norm_bound=norm_bound)
    build_seconds = time.perf_counter() - start

    rng = np.random.default_rng(config.seed)
    if eval_queries is None:
        eval_queries = torch.from_numpy(x[rng.choice(num_items, min(num_eval_queries, num_items), replace=False)])
    k = min(eval_k, num_items)
    exact_ids = ExactTopK(torch.from_numpy(x), ids, config.metric).search(eval_queries, k)[1]
    recall = recall_at_k(built.search(eval_queries, k)[1], exact_ids)
    device = "gpu" if _on_gpu(index) else "cpu"
    built.report = BuildReport(
        config.kind, num_items, dim, device, round(build_seconds, 3), k, len(eval_queries), recall, train_vectors
    )
    logger.info(
        "FAISS %s over %d items (D=%d, %s): recall@%d %.4f vs exact on %d queries; built in %.1f s (trained on %d)",
        _describe(config), num_items, dim, device, k, recall, len(eval_queries), build_seconds, train_vectors,
    )  # fmt: skip
    return built


def _with_norm_coordinate(x: np.ndarray) -> tuple[np.ndarray, float]:
    """(V, D+1): every vector with sqrt(M^2 - |x|^2) appended (M the largest norm), and M (`IndexConfig.mips_to_l2`)."""
    squared = (x.astype(np.float64) ** 2).sum(1)
    bound = float(np.sqrt(squared.max()))
    extra = np.sqrt(np.maximum(bound**2 - squared, 0.0)).astype(np.float32)
    return np.ascontiguousarray(np.hstack([x, extra[:, None]])), bound


def _read_meta(index_dir: Path) -> dict[str, Any] | None:
    """index.json, None when there is none; `DataError` naming it when it is not JSON or lacks what is read of it."""
    meta_path = index_dir / _MARKER
    if not meta_path.exists():
        return None
    return read_json_shaped(meta_path, _IndexMeta, "an index's index.json", REBUILD)


def _build_report(index_dir: Path, report: dict[str, Any]) -> BuildReport:
    try:
        return BuildReport(**report)
    except TypeError as err:  # keys missing or of another version
        raise DataError(index_dir / _MARKER, f"its build report does not read ({err})", REBUILD) from err


def _read_index(path: Path) -> Any:
    """The FAISS index in the file at `path`; `DataError` naming it when it is missing or not a FAISS index."""
    if not path.is_file():
        raise DataError(path, "no such file", REBUILD)
    try:
        return faiss.read_index(str(path))
    except RuntimeError as err:  # FAISS's C++ exceptions: cut short, another format
        why = str(err).strip().splitlines()[-1][:200] if str(err).strip() else "unreadable"
        raise DataError(path, f"not a FAISS index this version reads (cut short? {why})", REBUILD) from err


def _read_ids(path: Path, num_vectors: int) -> torch.Tensor:
    """ids.npy: the id of each of the index's `num_vectors` vectors; `DataError` naming it otherwise."""
    if not path.is_file():
        raise DataError(path, "no such file", REBUILD)
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:  # cut short, not an .npy, pickles
        raise DataError(path, f"not a readable .npy array ({type(err).__name__}: {str(err)[:200]})", REBUILD) from err
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(ids) != num_vectors:
        raise DataError(
            path,
            f"holds a {ids.dtype} array of shape {ids.shape}, not the ids of the index's {num_vectors} vectors",
            REBUILD,
        )
    return torch.from_numpy(ids)


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
    refine = "" if config.refine_k_factor is None else ",RFlat"
    return f"IVF{nlist},PQ{config.pq_m}x{config.pq_nbits}{'fs' if config.fast_scan else ''}{refine}"


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
    if config.device == "gpu" and not config.on_gpu_possible:
        raise ValueError(
            "FAISS has no GPU HNSW, fast-scan or refine index: on the GPU use kind flat, ivf_flat or ivf_pq without "
            "fast_scan and refine_k_factor, or use device: cpu"
        )
    if config.device == "cpu" or gpus == 0:
        return index
    if not config.on_gpu_possible:
        logger.info("FAISS %s stays on CPU (FAISS has no GPU HNSW, fast-scan or refine index)", _describe(config))
        return index
    return faiss.index_cpu_to_all_gpus(index)


def _describe(config: IndexConfig) -> str:
    return config.kind + (" fast-scan" if config.fast_scan else "") + (" + refine" if config.refine_k_factor else "")


def _on_gpu(index: Any) -> bool:
    return "Gpu" in type(index).__name__
