"""Residual k-means (RQ-KMeans): semantic IDs without training a network.

Level 1 clusters the embeddings into K centroids; level l clusters what is left after subtracting the
centroids chosen at levels 1..l-1. An item's code at level l is its nearest level-l centroid, and its
reconstruction is the sum of its L chosen centroids, so each level refines the one before and items
that share a prefix of codes are close in embedding space. Clustering is faiss k-means (seeded).

Dimension letters: N items, D embedding dim, L levels, K codes per level.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from recsys.errors import ConfigError, DataError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RQKMeansConfig:
    levels: int = 3  # L, as TIGER
    codebook_size: int = 256  # K centroids per level
    seed: int = 0
    niter: int = 25  # Lloyd iterations per level (faiss's default; more barely moves the error)

    def __post_init__(self) -> None:
        if self.levels < 1 or self.codebook_size < 2 or self.niter < 1:
            raise ConfigError(
                f"RQKMeansConfig needs levels >= 1, codebook_size >= 2, niter >= 1; got levels={self.levels}, "
                f"codebook_size={self.codebook_size}, niter={self.niter}. Fix: e.g. levels=3, codebook_size=256"
            )


@dataclass(frozen=True, eq=False)
class RQKMeans:
    """A fitted residual k-means tokenizer.

    Args:
        codebooks: (L, K, D) float32 centroids; level l's centroids live in the space of level-l residuals.

    Example:
        >>> x = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
        >>> model, codes = fit_rqkmeans(x, RQKMeansConfig(levels=2, codebook_size=4))
        >>> codes.shape, codes.dtype, model.decode(codes).shape
        ((200, 2), dtype('int64'), (200, 8))
        >>> bool((model.encode(x) == codes).all())
        True
    """

    codebooks: np.ndarray

    @property
    def levels(self) -> int:
        return int(self.codebooks.shape[0])

    @property
    def codebook_size(self) -> int:
        return int(self.codebooks.shape[1])

    def encode(self, x: np.ndarray) -> np.ndarray:
        """(N, D) embeddings -> (N, L) int64 codes, greedily level by level."""
        import faiss  # imported on use: generative models import this package on machines without faiss

        residual = _as_matrix(x, self.codebooks.shape[2]).copy()
        codes = np.empty((len(residual), self.levels), dtype=np.int64)
        for level, centroids in enumerate(self.codebooks):
            index = faiss.IndexFlatL2(centroids.shape[1])
            index.add(centroids)
            codes[:, level] = index.search(residual, 1)[1][:, 0]
            residual -= centroids[codes[:, level]]
        return codes

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(N, L) codes -> (N, D) float32 reconstructions: the sum of the chosen centroids."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != self.levels:
            raise ValueError(f"codes must be (N, {self.levels}), got shape {codes.shape}")
        return self.codebooks[np.arange(self.levels), codes].sum(axis=1)  # (N, L, D) -> (N, D)


def fit_rqkmeans(x: np.ndarray, config: RQKMeansConfig = RQKMeansConfig()) -> tuple[RQKMeans, np.ndarray]:
    """Fit L levels of k-means on successive residuals.

    Args:
        x: (N, D) item embeddings (e.g. from `recsys.semantic_ids.content.embed_items`), N >= K.
        config: levels, codebook size, seed.

    Returns:
        the fitted model and the codes of `x`, (N, L) int64.
    """
    residual = _as_matrix(x).copy()
    N, D = residual.shape
    if N < config.codebook_size:
        raise ConfigError(
            f"RQ-KMeans: {N} items cannot fill a codebook of {config.codebook_size} centroids. "
            f"Fix: set codebook_size <= {N}"
        )
    import faiss  # imported on use (see RQKMeans.encode)

    start = time.perf_counter()
    total = float(((residual - residual.mean(0)) ** 2).sum())
    codebooks = np.empty((config.levels, config.codebook_size, D), dtype=np.float32)
    codes = np.empty((N, config.levels), dtype=np.int64)
    for level in range(config.levels):
        kmeans = faiss.Kmeans(
            D,
            config.codebook_size,
            niter=config.niter,
            seed=config.seed + level,
            verbose=False,
            min_points_per_centroid=1,  # small catalogs are fine: no warning below 39 points per centroid
        )
        kmeans.train(residual)
        codebooks[level] = kmeans.centroids
        codes[:, level] = kmeans.index.search(residual, 1)[1][:, 0]
        residual -= codebooks[level][codes[:, level]]
        logger.info(
            "RQ-KMeans level %d: %d of %d codes used, residual %.4f of the variance",
            level + 1,
            len(np.unique(codes[:, level])),
            config.codebook_size,
            float((residual**2).sum()) / total,
        )
    logger.info(
        "RQ-KMeans fitted in %.1f s (%d items, %d levels of %d)",
        time.perf_counter() - start,
        N,
        config.levels,
        config.codebook_size,
    )
    return RQKMeans(codebooks), codes


def _as_matrix(x: np.ndarray, dim: int | None = None) -> np.ndarray:
    """C-contiguous float32 (N, D), as faiss wants; DataError naming the shape or the non-finite values."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or len(x) == 0 or (dim is not None and x.shape[1] != dim):
        want = f"(N, {dim})" if dim is not None else "(N, D) with N >= 1"
        raise DataError("embeddings", f"shape {x.shape} is not {want}", "pass one embedding row per item")
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x).all(axis=1)).argmax())
        raise DataError("embeddings", f"row {bad} holds NaN or inf", "re-compute the embeddings of that item")
    return x
