"""Top-k over several retrievers' items at once: e.g. a built FAISS index of the catalogue and an exact search over the
few items added since it was built.

Dimension letters: B queries, D vector dim, k results per query.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from recsys.retrieval.base import Metric, TopK, check_queries


class UnionTopK:
    """Each part's own top k, merged by score: the union's top k when the parts hold disjoint ids and score alike (the
    same metric over the same vector space).

    Example:
        >>> from recsys.retrieval import ExactTopK
        >>> catalogue = ExactTopK(torch.eye(3), torch.tensor([1, 2, 3]))
        >>> added = ExactTopK(torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([4]))
        >>> UnionTopK([catalogue, added]).search(torch.tensor([[0.0, 1.0, 0.5]]), 2)[1].tolist()
        [[4, 2]]
    """

    def __init__(self, parts: Sequence[TopK]) -> None:
        if not parts or len({part.dim for part in parts}) != 1:
            raise ValueError(f"a union needs retrievers of one dim, got dims {[part.dim for part in parts]}")
        if len({part.metric for part in parts}) != 1:
            raise ValueError(f"a union needs retrievers of one metric, got {[part.metric for part in parts]}")
        self.parts = list(parts)

    @property
    def num_items(self) -> int:
        return sum(part.num_items for part in self.parts)

    @property
    def dim(self) -> int:
        return self.parts[0].dim

    @property
    def metric(self) -> Metric:
        return self.parts[0].metric

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_queries(queries, k, self.dim, self.num_items)
        found = [part.search(queries, min(k, part.num_items)) for part in self.parts]
        scores = torch.cat([s.float().cpu() for s, _ in found], dim=1)
        ids = torch.cat([i.cpu() for _, i in found], dim=1)
        best, at = scores.topk(k, dim=1)  # a part's unfound slots (-inf, id -1) sort last
        return best, ids.gather(1, at)
