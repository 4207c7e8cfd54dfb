"""The new-item prior: ranks under a logit offset for never-trained items, and the offset chosen on validation."""

from __future__ import annotations

import pytest
import torch

from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit
from recsys.evaluation import EvalConfig, evaluate
from recsys.evaluation.new_item_prior import chosen_prior, ranks_with_priors


class TableScorer:
    """Scores item i as `table[i]` for every user."""

    max_history = 50

    def __init__(self, table: list[float]) -> None:
        self.table = torch.tensor(table)

    def score(self, histories: torch.Tensor, users: object = None, times: object = None) -> torch.Tensor:
        return self.table.expand(histories.shape[0], -1).clone()


def test_an_offset_lifts_the_new_items_alone_and_zero_gives_the_protocols_ranks() -> None:
    scorer = TableScorer([0.0, 5.0, 4.0, 3.0, 1.0, 0.5])  # items 4 and 5 never trained
    split = EvalSplit(Jagged.from_lists([[1], [2, 3], [1]]), torch.tensor([4, 1, 5]), torch.arange(1, 4))
    new = torch.tensor([False, False, False, False, True, True])
    ranks = ranks_with_priors(scorer, split, new, [0.0, 2.5, 10.0], EvalConfig(batch_size=2))
    assert ranks[0].tolist() == evaluate(scorer, split, 5).ranks.tolist() == [3, 0, 4]
    assert ranks[1].tolist() == [2, 0, 4]  # item 4 at 3.5 passes item 3, not item 2; item 5 ties item 3 (3.0)
    assert ranks[2].tolist() == [0, 2, 1]  # far enough: the new items first, in their own order


def test_a_mask_that_is_not_one_of_items_is_refused() -> None:
    split = EvalSplit(Jagged.from_lists([[1]]), torch.tensor([2]), torch.arange(1, 2))
    with pytest.raises(ValueError, match=r"\(V\+1,\) bool mask"):
        ranks_with_priors(TableScorer([0.0, 1.0, 2.0]), split, torch.tensor([0, 0, 1]), [0.0])
    with pytest.raises(ValueError, match="padding"):
        ranks_with_priors(TableScorer([0.0, 1.0, 2.0]), split, torch.tensor([True, False, True]), [0.0])


def test_the_chosen_offset_is_the_largest_within_the_warm_tolerance() -> None:
    warm = [0.050, 0.0499, 0.0491, 0.0489, 0.0495]  # not monotone: the largest offset that passes is taken
    assert chosen_prior([0.0, 1.0, 2.0, 3.0, 4.0], warm, tolerance=0.02) == 4.0
    assert chosen_prior([0.0, 1.0, 2.0, 3.0, 4.0], warm, tolerance=0.0) == 0.0
    # against another model's warm N@10: a better model spends its margin, one below it keeps its own scores
    assert chosen_prior([0.0, 1.0, 2.0, 3.0, 4.0], warm, tolerance=0.02, baseline=0.0499) == 4.0
    assert chosen_prior([0.0, 1.0, 2.0, 3.0, 4.0], [0.05, 0.04, 0.03, 0.02, 0.01], 0.02, baseline=0.035) == 1.0
    assert chosen_prior([0.0, 1.0, 2.0, 3.0, 4.0], warm, tolerance=0.02, baseline=0.06) == 0.0
    with pytest.raises(ValueError, match="baseline"):
        chosen_prior([0.0, 1.0], [0.05, 0.04], tolerance=0.02, baseline=float("nan"))
    with pytest.raises(ValueError, match="offset 0"):
        chosen_prior([1.0, 2.0], [0.05, 0.04], tolerance=0.02)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        chosen_prior([0.0], [0.05], tolerance=1.0)
