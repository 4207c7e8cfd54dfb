"""Which FAISS index to build and how to search it; a plain config, importable without faiss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from recsys.retrieval.base import Metric

IndexKind = Literal["flat", "ivf_flat", "hnsw", "ivf_pq"]
INDEX_FILE = "index.faiss"  # the index inside its directory


@dataclass(frozen=True)
class IndexConfig:
    """Which FAISS index and its knobs (build-time and search-time).

    Attributes:
        kind: "flat" (exact, FAISS's brute force), "ivf_flat", "hnsw" or "ivf_pq".
        metric: "ip" or "l2" (scores are minus the squared distance).
        nlist: IVF cells; None = 4 * sqrt(V), at most V / 39 (FAISS wants >= 39 training points per cell).
        nprobe: IVF cells visited per query (search time: recall vs speed).
        hnsw_m: HNSW graph degree.
        ef_construction: HNSW candidate list while building.
        ef_search: HNSW candidate list per query (search time; raised to k when smaller).
        pq_m: IVF-PQ sub-quantizers (must divide D); pq_nbits: bits per sub-code.
        fast_scan: IVF-PQ codes in FAISS's SIMD "fast-scan" layout (needs pq_nbits 4): scanning a cell costs a
            fraction of 8-bit PQ's, so many more cells can be probed for the same time.
        refine_k_factor: IVF-PQ only: keep the raw vectors too and re-rank the best k * factor PQ candidates by
            their exact scores (FAISS IndexRefineFlat; search time, >= 1); None = PQ scores as they are.
        train_size: vectors sampled to train IVF / PQ; None = min(V, 64 * nlist).
        max_build_seconds: the build's time budget, checked after training and after each chunk of vectors added;
            passing it raises `recsys.errors.BudgetExceeded` naming this knob (no partial index). None = no budget.
        mips_to_l2: metric "ip" only: the index holds every vector with one more coordinate, sqrt(M^2 - |x|^2) (M the
            largest norm), and is searched by L2 with the query's extra coordinate 0, so the L2 nearest are the
            inner-product best (Bachrach et al. 2014). IVF cells and HNSW links then follow what a query's top k holds
            even when the vectors' norms differ widely (a trained item table: its popular items have the largest),
            where inner-product IVF and HNSW lose most of it. Scores come back as inner products.
        device: "auto" (GPU when faiss has GPUs and the index runs there), "cpu" or "gpu".
        seed: training sample and k-means seed.
    """

    kind: IndexKind = "ivf_flat"
    metric: Metric = "ip"
    nlist: int | None = None
    nprobe: int = 32
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    pq_m: int = 16
    pq_nbits: int = 8
    fast_scan: bool = False
    refine_k_factor: float | None = None
    train_size: int | None = None
    max_build_seconds: float | None = None
    mips_to_l2: bool = False
    device: Literal["auto", "cpu", "gpu"] = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("flat", "ivf_flat", "hnsw", "ivf_pq"):
            raise ValueError(f'index kind must be "flat", "ivf_flat", "hnsw" or "ivf_pq", got {self.kind!r}')
        if self.metric not in ("ip", "l2"):
            raise ValueError(f'metric must be "ip" or "l2", got {self.metric!r}')
        if self.device not in ("auto", "cpu", "gpu"):
            raise ValueError(f'device must be "auto", "cpu" or "gpu", got {self.device!r}')
        for name in ("nprobe", "hnsw_m", "ef_construction", "ef_search", "pq_m", "pq_nbits"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.fast_scan or self.refine_k_factor is not None) and self.kind != "ivf_pq":
            raise ValueError(
                f"fast_scan and refine_k_factor apply to kind ivf_pq (its compressed codes), not {self.kind!r}, whose "
                "scores are already exact per vector: drop them, or use kind: ivf_pq"
            )
        if self.fast_scan and self.pq_nbits != 4:
            raise ValueError(f"fast_scan needs pq_nbits: 4 (FAISS's fast-scan codes are 4-bit), got {self.pq_nbits}")
        if self.refine_k_factor is not None and self.refine_k_factor < 1:
            raise ValueError(
                f"refine_k_factor must be >= 1 (candidates re-ranked per result), got {self.refine_k_factor}"
            )
        if self.mips_to_l2 and self.metric != "ip":
            raise ValueError('mips_to_l2 turns an inner-product search into an L2 one: it needs metric: "ip"')
        if self.max_build_seconds is not None and self.max_build_seconds <= 0:
            raise ValueError(f"max_build_seconds must be > 0 (None = no budget), got {self.max_build_seconds}")

    @property
    def on_gpu_possible(self) -> bool:
        """Whether FAISS can run this index on a GPU (it has no GPU HNSW, fast-scan or refine index)."""
        return self.kind != "hnsw" and not self.fast_scan and self.refine_k_factor is None
