"""The evaluation protocol on a scorer whose scores are known in advance."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit
from recsys.data.times import HistoryTimes
from recsys.errors import BudgetExceeded
from recsys.evaluation import EvalConfig, UserSample, evaluate
from recsys.runtime import progress


class FixedScorer:
    """Scores item i as `table[i]` for every user; records the histories, users and timestamps it was given."""

    max_history = 50

    def __init__(self, table: list[float]) -> None:
        self.table = torch.tensor(table)
        self.widths: list[int] = []
        self.users: list[list[int]] = []
        self.times: list[tuple[list[list[int]], list[int]]] = []

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        self.widths.append(histories.shape[1])
        self.users.append([] if users is None else users.tolist())
        self.times.append(([], []) if times is None else (times.items.tolist(), times.request.tolist()))
        return self.table.expand(histories.shape[0], -1).clone()


def split(histories: list[list[int]], targets: list[int]) -> EvalSplit:
    return EvalSplit(Jagged.from_lists(histories), torch.tensor(targets), torch.arange(1, len(targets) + 1))


def test_full_ranking_metrics_and_rank_order() -> None:
    # item scores: 1 > 2 > 3 > 4 (index 0 is padding and is masked by the protocol)
    scorer = FixedScorer([100.0, 4.0, 3.0, 2.0, 1.0])
    s = split([[1], [2, 3, 4], [4, 1]], targets=[1, 3, 4])  # ranks 0, 2, 3
    result = evaluate(scorer, s, num_items=4, config=EvalConfig(ks=(1, 3), batch_size=2))
    assert result.ranks.tolist() == [0, 2, 3]
    assert result.metrics["recall@1"] == pytest.approx(1 / 3)
    assert result.metrics["recall@3"] == pytest.approx(2 / 3)
    assert result.metrics["coverage@1"] == pytest.approx(1 / 4)
    # users are batched by history length (1, 2 | 3): each batch is padded to its own longest history
    assert scorer.widths == [2, 3]
    assert scorer.users == [[1, 3], [2]]  # each row's user_idx travels with its history


def test_a_catalogue_smaller_than_the_longest_list_is_listed_whole() -> None:
    scorer = FixedScorer([100.0, 4.0, 3.0, 2.0, 1.0])
    result = evaluate(scorer, split([[1], [2]], targets=[4, 3]), num_items=4, config=EvalConfig(ks=(1, 10)))
    assert result.metrics["recall@10"] == 1.0 and result.metrics["coverage@10"] == 1.0


def test_times_travel_left_padded_with_their_histories() -> None:
    scorer = FixedScorer([0.0, 4.0, 3.0, 2.0, 1.0])
    s = EvalSplit(
        Jagged.from_lists([[1, 2, 3], [4]]),
        torch.tensor([1, 2]),
        torch.arange(1, 3),
        timestamps=Jagged.from_lists([[10, 20, 30], [40]]),
        request_times=torch.tensor([35, 45]),
    )
    evaluate(scorer, s, num_items=4, config=EvalConfig(ks=(1,), batch_size=1))
    assert scorer.times == [([[40]], [45]), ([[10, 20, 30]], [35])]  # batched by length like the histories


def test_exclude_seen_masks_history_items() -> None:
    scorer = FixedScorer([0.0, 4.0, 3.0, 2.0, 1.0])
    s = split([[1], [2]], targets=[2, 2])
    default = evaluate(scorer, s, num_items=4, config=EvalConfig(ks=(1,)))
    excluded = evaluate(scorer, s, num_items=4, config=EvalConfig(ks=(1,), exclude_seen=True))
    assert default.ranks.tolist() == [1, 1]
    # user 1 saw item 1, so item 2 moves to the top; user 2 saw the target itself: a miss
    assert excluded.ranks[0].item() == 0
    assert excluded.ranks[1].item() >= 4


def test_empty_history_is_scored() -> None:
    scorer = FixedScorer([0.0, 1.0, 2.0])
    result = evaluate(scorer, split([[]], targets=[2]), num_items=2, config=EvalConfig(ks=(1,)))
    assert result.ranks.tolist() == [0]


def test_a_user_sample_is_labelled_and_ranks_its_users_as_the_full_protocol_does() -> None:
    scorer = FixedScorer([0.0, *range(30, 0, -1)])  # item i scores 31 - i
    generator = torch.Generator().manual_seed(0)
    targets = torch.randint(1, 31, (40,), generator=generator).tolist()
    s = split([[1] * (user % 7) for user in range(40)], targets)  # batched by length: not in row order
    full = evaluate(scorer, s, num_items=30, config=EvalConfig(ks=(5,)))
    sample = UserSample(users=12, seed=7)
    sampled = evaluate(scorer, s, num_items=30, config=EvalConfig(ks=(5,), batch_size=5), sample=sample)
    assert full.sample is None
    assert sampled.sample == sample and len(sampled.ranks) == 12
    assert torch.equal(sampled.ranks, full.ranks[sample.rows(40)])
    assert sampled.metrics["mrr"] == pytest.approx((1.0 / (sampled.ranks + 1.0)).mean().item())


def test_a_user_sample_is_the_same_for_the_same_seed_only() -> None:
    assert torch.equal(UserSample(users=10, seed=3).rows(1000), UserSample(users=10, seed=3).rows(1000))
    assert not torch.equal(UserSample(users=10, seed=3).rows(1000), UserSample(users=10, seed=4).rows(1000))
    rows = UserSample(users=10, seed=3).rows(1000)
    assert len(set(rows.tolist())) == 10 and bool((rows.diff() > 0).all())
    assert UserSample(users=50).rows(20).tolist() == list(range(20))  # more than the split has: every user


def test_progress_is_logged_per_user_batch_with_a_rate_and_an_eta(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)  # a line per batch, not one every few seconds
    s = split([[1], [2, 3, 4], [4, 1]], targets=[1, 3, 4])
    with caplog.at_level(logging.INFO, logger="recsys.evaluation"):
        scorer, config = FixedScorer([0.0, 4.0, 3.0, 2.0, 1.0]), EvalConfig(ks=(1,), batch_size=2)
        evaluate(scorer, s, num_items=4, config=config, what="evaluation of test")
    first, second, done = caplog.messages
    assert first.startswith("evaluation of test: 2 of 3 users (67%), ") and "users/s, ETA " in first
    assert second.startswith("evaluation of test: 3 of 3 users (100%), ") and second.endswith("ETA 0 s")
    assert done.startswith("evaluation of test: done, 3 users in ")


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ({"max_memory_gb": 0.001}, r"over its budget of 0\.001 GiB \(after 2 of 3 users\)\. Fix: raise --max-memory-gb "
         r"\(eval\.max_memory_gb in a config\), or lower eval\.batch_size or eval\.item_block"),
        ({"max_seconds": 1e-9}, r"over its time budget of 1e-09 s \(after 2 of 3 users\)\. Fix: raise --max-seconds "
         r"\(eval\.max_seconds in a config\), or evaluate a sample of the users"),
    ],
)  # fmt: skip
def test_a_budget_too_small_stops_the_evaluation_after_a_batch_naming_the_knob(
    budget: dict[str, float], expected: str
) -> None:
    s = split([[1], [2, 3, 4], [4, 1]], targets=[1, 3, 4])
    scorer = FixedScorer([0.0, 4.0, 3.0, 2.0, 1.0])
    with pytest.raises(BudgetExceeded, match=f"^evaluation: .*{expected}"):
        evaluate(scorer, s, num_items=4, config=EvalConfig(ks=(1,), batch_size=2, **budget))  # type: ignore[arg-type]
    assert len(scorer.widths) == 1  # stopped after the first batch, not at the end
    evaluate(scorer, s, num_items=4, config=EvalConfig(ks=(1,), max_seconds=600.0, max_memory_gb=1000.0))
