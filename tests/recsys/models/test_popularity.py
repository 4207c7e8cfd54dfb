from __future__ import annotations

import torch

from recsys.models.popularity import Popularity, PopularityConfig


def test_ranks_by_count_with_a_strict_order() -> None:
    m = Popularity(PopularityConfig(num_items=4))
    m.fit(torch.tensor([0, 2, 5, 2, 1]))  # items 1 and 3 tie: the lower index wins
    scores = m.score(torch.zeros(2, 3, dtype=torch.long))
    assert scores.shape == (2, 5)
    assert scores[0].argsort(descending=True).tolist()[:4] == [2, 1, 3, 4]
    assert len(set(scores[0, 1:].tolist())) == 4
