"""Which FAISS index to build and how to search it; a plain config, importable without faiss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from recsys.retrieval.base import Metric

IndexKind = Literal["flat", "ivf_flat", "hnsw", "ivf_pq"]


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
        train_size: vectors sampled to train IVF / PQ; None = min(V, 64 * nlist).
        device: "auto" (GPU when faiss has GPUs and the kind runs there), "cpu" or "gpu".
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
    train_size: int | None = None
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
