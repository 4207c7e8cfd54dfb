"""Exact top-k by brute force in torch: the reference every approximate index is measured against."""

from __future__ import annotations

import torch

from recsys.retrieval.base import Metric, check_item_vectors, check_queries


class ExactTopK:
    """All V item scores per query, then `torch.topk`, in query chunks so memory stays (chunk, V).

    Args:
        vectors: (V, D) item vectors (kept in fp32 on their device).
        ids: (V,) int64 id of each vector; None = 0..V-1.
        metric: "ip" (inner product) or "l2" (scores = minus the squared distance).
        chunk_size: queries scored at once.
    """

    def __init__(
        self, vectors: torch.Tensor, ids: torch.Tensor | None = None, metric: Metric = "ip", chunk_size: int = 1024
    ) -> None:
        self.ids = check_item_vectors(vectors, ids).to(vectors.device)
        if metric not in ("ip", "l2"):
            raise ValueError(f'metric must be "ip" or "l2", got {metric!r}')
        self.vectors = vectors.float()
        self.metric: Metric = metric
        self.chunk_size = chunk_size
        self._sq_norms = self.vectors.square().sum(1) if metric == "l2" else None  # (V,)

    @property
    def num_items(self) -> int:
        return self.vectors.shape[0]

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    @torch.no_grad()
    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_queries(queries, k, self.dim, self.num_items)
        scores, positions = [], []
        for chunk in queries.to(self.vectors.device, torch.float32).split(self.chunk_size):
            s = chunk @ self.vectors.T  # (b, V)
            if self._sq_norms is not None:  # -|q - v|^2 = 2 q.v - |v|^2 - |q|^2
                s = 2 * s - self._sq_norms - chunk.square().sum(1, keepdim=True)
            top = torch.topk(s, k, dim=1)
            scores.append(top.values)
            positions.append(top.indices)
        return torch.cat(scores), self.ids[torch.cat(positions)]
