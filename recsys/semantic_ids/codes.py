"""Semantic-ID tuples: collision resolution, health statistics and the on-disk format.

Collision resolution (TIGER): items that share all L codes get an extra code 0, 1, 2, ... in row order;
an item alone gets 0. The L+1 codes then name exactly one item.

On disk (`write_semantic_ids`):
    semantic_ids.parquet        item_idx int32 (1..V, every item once), item_id str,
                                codes list[int16] (list[int32] if a code exceeds 32767) of length L+1.
    semantic_ids.stats.json     the `SemanticIdStats` of the codes, the codebook size per level, and `meta`.

In memory (`read_semantic_ids` -> `SemanticIds`): codes (V+1, L+1) int64 indexed by item_idx; row 0, the
padding item, is all -1 (never a valid code, so a padding row used as a target fails loudly).

Dimension letters: N items, V items of the catalog, L levels (before de-duplication), D embedding dim.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recsys.data import schema
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_file

CODES = "codes"
SEMANTIC_IDS_FILE = "semantic_ids.parquet"
PADDING_CODE = -1


def deduplicate(codes: np.ndarray) -> np.ndarray:
    """Append TIGER's collision level: the rank of each item among the items sharing its L codes.

    Args:
        codes: (N, L) integer codes.

    Returns:
        (N, L+1) int64; every row is unique.

    Example:
        >>> deduplicate(np.array([[1, 2], [3, 4], [1, 2], [1, 2]])).tolist()
        [[1, 2, 0], [3, 4, 0], [1, 2, 1], [1, 2, 2]]
    """
    codes = _as_codes(codes)
    _, group = np.unique(codes, axis=0, return_inverse=True)  # (N,) tuple id
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")  # rows grouped by tuple, row order kept inside a group
    sorted_group = group[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_group)) + 1]  # start of each group in `order`
    starts = np.repeat(first, np.diff(np.r_[first, len(order)]))
    rank = np.empty(len(codes), dtype=np.int64)
    rank[order] = np.arange(len(order)) - starts
    return np.concatenate([codes, rank[:, None]], axis=1)


@dataclass(frozen=True)
class SemanticIdStats:
    """Health of a set of semantic IDs (computed on the L codes, before de-duplication).

    Args:
        num_items: N.
        levels: L.
        codebook_size: K codes per level.
        utilisation: per level, the share of the K codes that at least one item uses.
        perplexity: per level, exp(entropy of the code distribution): K when items spread evenly over all
            codes, 1 when they all share one.
        unique_prefixes: per level l, the number of distinct tuples of the first l codes.
        collision_rate: the share of items whose L-code tuple is shared with another item.
        max_collision: the largest number of items sharing one L-code tuple (= codebook size of the
            de-duplication level).
        recon_mse: mean over items and dimensions of (x - x_hat)^2, or None when not measured.
        recon_relative: ||x - x_hat||^2 / ||x - mean(x)||^2 over all items, the share of the embeddings'
            variance the codes do not explain (0 = perfect, 1 = no better than the mean), or None.
    """

    num_items: int
    levels: int
    codebook_size: int
    utilisation: tuple[float, ...]
    perplexity: tuple[float, ...]
    unique_prefixes: tuple[int, ...]
    collision_rate: float
    max_collision: int
    recon_mse: float | None = None
    recon_relative: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SemanticIdStats:
        values = dict(raw)
        for key in ("utilisation", "perplexity", "unique_prefixes"):
            values[key] = tuple(values[key])
        return cls(**values)


def semantic_id_stats(
    codes: np.ndarray, codebook_size: int, x: np.ndarray | None = None, x_hat: np.ndarray | None = None
) -> SemanticIdStats:
    """Health statistics of (N, L) codes and, given both, of the reconstructions x_hat (N, D) of x (N, D).

    Example:
        >>> s = semantic_id_stats(np.array([[0, 1], [0, 1], [0, 2], [1, 0]]), codebook_size=4)
        >>> s.utilisation, s.unique_prefixes, s.collision_rate, s.max_collision
        ((0.5, 0.75), (2, 3), 0.5, 2)
    """
    codes = _as_codes(codes)
    N, L = codes.shape
    utilisation, perplexity, unique_prefixes = [], [], []
    for level in range(L):
        counts = np.unique(codes[:, level], return_counts=True)[1]
        p = counts / N
        utilisation.append(len(counts) / codebook_size)
        perplexity.append(float(math.exp(-(p * np.log(p)).sum())))
        unique_prefixes.append(len(np.unique(codes[:, : level + 1], axis=0)))
    group_sizes = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    inverse, counts = group_sizes[1].reshape(-1), group_sizes[2]
    recon_mse = recon_relative = None
    if x is not None and x_hat is not None:
        x, x_hat = np.asarray(x, dtype=np.float64), np.asarray(x_hat, dtype=np.float64)
        if x.shape != x_hat.shape or len(x) != N:
            raise ValueError(f"x {x.shape} and x_hat {x_hat.shape} must both be ({N}, D)")
        error = float(((x - x_hat) ** 2).sum())
        recon_mse = error / x.size
        recon_relative = error / max(float(((x - x.mean(0)) ** 2).sum()), 1e-30)
    return SemanticIdStats(
        num_items=N,
        levels=L,
        codebook_size=codebook_size,
        utilisation=tuple(utilisation),
        perplexity=tuple(perplexity),
        unique_prefixes=tuple(unique_prefixes),
        collision_rate=float((counts[inverse] > 1).mean()),
        max_collision=int(counts.max()),
        recon_mse=recon_mse,
        recon_relative=recon_relative,
    )


@dataclass(frozen=True)
class SemanticIds:
    """Semantic IDs of a catalog, indexed by item_idx.

    Args:
        codes: (V+1, L+1) int64; row i holds item_idx i's codes, row 0 (padding) is all -1.
        codebook_sizes: (L+1,) the number of codes per level: K for the first L, the largest collision
            group for the de-duplication level.
        meta: what produced the codes (method, configs, embedding model), as written.
    """

    codes: torch.Tensor
    codebook_sizes: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_items(self) -> int:
        return int(self.codes.shape[0]) - 1

    @property
    def num_levels(self) -> int:
        """L+1, the de-duplication level included."""
        return int(self.codes.shape[1])


def stats_path(path: Path) -> Path:
    """The stats JSON beside a semantic-IDs parquet: semantic_ids.parquet -> semantic_ids.stats.json."""
    return path.with_name(f"{path.stem}.stats.json")


def write_semantic_ids(
    path: Path,
    item_idx: np.ndarray | Sequence[int],
    item_id: Sequence[str],
    codes: np.ndarray,
    stats: SemanticIdStats,
    *,
    meta: Mapping[str, Any] | None = None,
) -> None:
    """Write de-duplicated semantic IDs and their stats, each file atomically.

    Args:
        path: the parquet file, e.g. `<dir>/semantic_ids.parquet`; the stats go to `stats_path(path)`.
        item_idx: (V,) internal ids, each of 1..V exactly once.
        item_id: (V,) external ids, aligned with item_idx.
        codes: (V, L+1) de-duplicated codes (`deduplicate`), aligned with item_idx.
        stats: `semantic_id_stats` of the L codes.
        meta: JSON-serialisable provenance (method, configs, embedding model).
    """
    path = Path(path)
    codes = _as_codes(codes)
    idx = np.asarray(item_idx, dtype=np.int64).reshape(-1)
    V = len(idx)
    if len(item_id) != V or len(codes) != V:
        raise DataError(path, f"{V} item_idx, {len(item_id)} item_id and {len(codes)} code rows", "align them")
    if not np.array_equal(np.sort(idx), np.arange(1, V + 1)):
        raise DataError(path, "item_idx is not 1..V with every item once", "pass the item_idx of items.parquet")
    if codes.shape[1] != stats.levels + 1:
        raise DataError(
            path, f"codes have {codes.shape[1]} levels, stats describe {stats.levels} + 1", "pass deduplicate(codes)"
        )
    if len(np.unique(codes, axis=0)) != V:
        raise DataError(path, "two items have the same codes", "pass deduplicate(codes), not the raw L codes")
    import polars as pl  # the files' reader and writer: a model holding semantic IDs needs neither

    dtype = pl.Int16 if int(codes.max()) <= np.iinfo(np.int16).max else pl.Int32
    order = np.argsort(idx)
    table = pl.DataFrame(
        {
            schema.ITEM_IDX: pl.Series(idx[order], dtype=pl.Int32),
            schema.ITEM_ID: pl.Series([str(item_id[i]) for i in order], dtype=pl.String),
            CODES: pl.Series(codes[order].tolist(), dtype=pl.List(dtype)),
        }
    )
    sizes = [stats.codebook_size] * stats.levels + [stats.max_collision]
    payload = {"stats": stats.to_dict(), "codebook_sizes": sizes, "meta": dict(meta or {})}
    with atomic_file(stats_path(path)) as tmp:
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
    with atomic_file(path) as tmp:
        table.write_parquet(tmp)


def read_semantic_ids(path: Path) -> tuple[SemanticIds, SemanticIdStats]:
    """Read `write_semantic_ids` output; DataError naming the file and the problem.

    Returns:
        the codes (V+1, L+1) int64 with row 0 = -1 (padding) and the codebook sizes, and the stats.
    """
    path = Path(path)
    for file in (path, stats_path(path)):
        if not file.is_file():
            raise DataError(file, "semantic IDs file not found", "write it with write_semantic_ids")
    import polars as pl

    payload = json.loads(stats_path(path).read_text())
    stats = SemanticIdStats.from_dict(payload["stats"])
    table = pl.read_parquet(path).sort(schema.ITEM_IDX)
    idx = table[schema.ITEM_IDX].to_numpy().astype(np.int64)
    if not np.array_equal(idx, np.arange(1, len(idx) + 1)):
        raise DataError(path, "item_idx is not 1..V with every item once", "write the file again")
    codes = np.asarray(table[CODES].to_list(), dtype=np.int64).reshape(len(idx), -1)  # (V, L+1)
    if codes.shape[1] != stats.levels + 1:
        raise DataError(path, f"{codes.shape[1]} codes per item, the stats say {stats.levels} + 1", "write it again")
    padded = np.full((len(idx) + 1, codes.shape[1]), PADDING_CODE, dtype=np.int64)
    padded[1:] = codes
    ids = SemanticIds(torch.from_numpy(padded), tuple(payload["codebook_sizes"]), payload.get("meta", {}))
    return ids, stats


def _as_codes(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 2 or len(codes) == 0 or not np.issubdtype(codes.dtype, np.integer):
        raise DataError("codes", f"shape {codes.shape} dtype {codes.dtype} is not (N, L) integers", "pass (N, L) ints")
    if int(codes.min()) < 0:
        raise DataError("codes", "negative code (-1 marks the padding row only)", "pass codes of real items")
    return codes.astype(np.int64, copy=False)
