"""The `TopK` interface every retriever implements, and the checks they share.

Dimension letters: B queries, D vector dim, V items, k results per query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import torch

Metric = Literal["ip", "l2"]  # inner product (higher is better) or squared L2 distance (scores = -distance)


class TopK(Protocol):
    """`search(queries (B, D), k) -> (scores (B, k) fp32, ids (B, k) int64)`, best first.

    Scores are "higher is better" for every metric (an L2 retriever returns minus the squared distance).
    An approximate index may find fewer than k items for a query: those slots hold id -1 and score -inf.
    """

    @property
    def num_items(self) -> int: ...

    @property
    def dim(self) -> int: ...

    @property
    def metric(self) -> Metric:
        """How it scores a query against an item vector."""
        ...

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_item_vectors(vectors: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Validate (V, D) item vectors and their (V,) int64 ids; returns the ids (0..V-1 when None)."""
    if vectors.ndim != 2 or not vectors.is_floating_point() or vectors.shape[0] == 0:
        raise ValueError(
            f"item vectors must be a non-empty (V, D) float tensor, got {tuple(vectors.shape)} {vectors.dtype}"
        )
    if ids is None:
        return torch.arange(vectors.shape[0], dtype=torch.int64)
    if ids.shape != (vectors.shape[0],) or ids.dtype != torch.int64:
        raise ValueError(
            f"ids must be a ({vectors.shape[0]},) int64 tensor (one per vector), got {tuple(ids.shape)} {ids.dtype}"
        )
    return ids.cpu()


def check_queries(queries: torch.Tensor, k: int, dim: int, num_items: int) -> None:
    if queries.ndim != 2 or queries.shape[1] != dim or not queries.is_floating_point():
        raise ValueError(f"queries must be a (B, {dim}) float tensor, got {tuple(queries.shape)} {queries.dtype}")
    if not 1 <= k <= num_items:
        raise ValueError(f"k must be in [1, {num_items}] (the number of indexed items), got {k}")


def check_query_texts(queries: Sequence[str]) -> None:
    """Refuse an empty batch or an empty (blank) query, naming the first one."""
    if isinstance(queries, str):
        raise TypeError(f"pass a sequence of query texts, got one string {queries!r}. Fix: wrap it in a list")
    if not len(queries):
        raise ValueError("no queries given. Fix: pass at least one query text")
    blank = [i for i, q in enumerate(queries) if not q.strip()]
    if blank:
        raise ValueError(
            f"query {blank[0]} is empty ({len(blank)} of {len(queries)} are). Fix: leave out the users without "
            "a query (the protocol's queries are '' where an item's title has no usable word)"
        )
