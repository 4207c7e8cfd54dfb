"""Full ranking in item blocks gives the ranks and top-k lists of the whole (B, V+1) score matrix."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit, SequenceData, load_prepared
from recsys.data.times import HistoryTimes
from recsys.evaluation import EvalConfig, EvalResult, Scorer, evaluate
from recsys.evaluation.item_blocks import item_blocks
from recsys.models.registry import build_model
from recsys.models.sasrec import SASRec, SASRecConfig

SASREC = {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64}
KS = (1, 5, 10, 50)


@pytest.fixture(scope="module")
def cold_data(tmp_path_factory: pytest.TempPathFactory) -> SequenceData:
    """A small synthetic dataset with a fifth of its 150 items cold (never in histories, still targets)."""
    out = tmp_path_factory.mktemp("cold") / "prepared"
    prepare(
        load_source("synthetic", None, num_users=300, num_items=150),
        out,
        PrepareSettings(cold_start_fraction=0.2, seed=1),
    )
    return load_prepared(out)


def ranked(scorer: Scorer, split: EvalSplit, num_items: int, item_block: int, exclude_seen: bool) -> EvalResult:
    config = EvalConfig(ks=KS, exclude_seen=exclude_seen, batch_size=64, item_block=item_block)
    return evaluate(scorer, split, num_items, config)


def assert_same_ranking(blocked: EvalResult, whole: EvalResult) -> None:
    assert torch.equal(blocked.ranks, whole.ranks)
    assert blocked.metrics == whole.metrics  # coverage included: the top-k lists cover the same items


@pytest.mark.parametrize("exclude_seen", [False, True])
@pytest.mark.parametrize("item_block", [7, 64, 149, 150])
def test_item_blocks_rank_a_sasrec_as_the_whole_catalogue(
    cold_data: SequenceData, item_block: int, exclude_seen: bool
) -> None:
    torch.manual_seed(0)
    model = build_model("sasrec", SASREC, cold_data.num_items).eval()
    split = cold_data.eval_split("test")
    assert bool(cold_data.cold_mask[split.targets].any())  # cold targets are ranked too
    whole = ranked(model, split, cold_data.num_items, 0, exclude_seen)
    assert_same_ranking(ranked(model, split, cold_data.num_items, item_block, exclude_seen), whole)


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_items_outside_the_candidates_are_masked_in_every_block(cold_data: SequenceData, exclude_seen: bool) -> None:
    torch.manual_seed(1)
    model = build_model("sasrec", SASREC, cold_data.num_items).eval()
    split = cold_data.eval_split("test")
    candidates = torch.arange(cold_data.num_items + 1) % 3 != 0  # some targets are not candidates: misses
    split = replace(split, candidates=candidates)
    whole = ranked(model, split, cold_data.num_items, 0, exclude_seen)
    assert int((whole.ranks == cold_data.num_items).sum()) >= int((~candidates[split.targets]).sum())
    assert_same_ranking(ranked(model, split, cold_data.num_items, 16, exclude_seen), whole)


def test_items_with_the_same_vector_tie_with_the_target_in_any_block(cold_data: SequenceData) -> None:
    # represented by their semantic IDs only, items with the same codes share a vector: their scores tie exactly
    items = torch.arange(cold_data.num_items + 1)
    codes = torch.stack([items % 4, items % 5], dim=1)
    codes[0] = -1
    config = SASRecConfig(num_items=cold_data.num_items, sid_levels=2, id_embeddings=False, **SASREC)
    torch.manual_seed(2)
    model = SASRec(config, codes).eval()
    split = cold_data.eval_split("test")
    whole = ranked(model, split, cold_data.num_items, 0, exclude_seen=False)
    assert int(whole.ranks.min()) >= 6  # each target ties with the 7 or 8 items of its codes, counted above it
    for item_block in (7, 13, 100):
        assert_same_ranking(ranked(model, split, cold_data.num_items, item_block, exclude_seen=False), whole)


class ItemValues:
    """A vector scorer of one dimension: item i scores `values[i]` for every user; `score` (the whole catalogue)
    counts its calls."""

    max_history = 10

    def __init__(self, values: list[float]) -> None:
        self.values = torch.tensor(values)[:, None]  # (V+1, 1)
        self.whole_catalogue_calls = 0

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        return torch.ones(histories.shape[0], 1)

    def item_embeddings(self) -> torch.Tensor:
        return self.values

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        self.whole_catalogue_calls += 1
        return self.encode_queries(histories) @ self.item_embeddings().T


@pytest.mark.parametrize("item_block", [1, 2, 4])
def test_blocks_never_score_the_whole_catalogue_and_keep_the_tie_rule(item_block: int) -> None:
    scorer = ItemValues([0.0, 3.0, 1.0, 3.0, 2.0, 3.0, 0.5])
    # targets: 3 (ties with 1 and 5: rank 2), 4 (rank 3), 5 seen in its history (masked with exclude_seen: rank V)
    split = EvalSplit(Jagged.from_lists([[2], [], [5, 6]]), torch.tensor([3, 4, 5]), torch.arange(1, 4))
    config = EvalConfig(ks=(1, 2), exclude_seen=True, item_block=item_block)
    blocked = evaluate(scorer, split, num_items=6, config=config)
    assert scorer.whole_catalogue_calls == 0
    assert blocked.ranks.tolist() == [2, 3, 6]
    whole = evaluate(scorer, split, num_items=6, config=replace(config, item_block=0))
    assert scorer.whole_catalogue_calls > 0
    assert_same_ranking(blocked, whole)
    assert blocked.metrics["coverage@1"] == pytest.approx(1 / 6)  # item 1 tops every list: lower id of the ties


def test_a_catalogue_that_fits_one_block_is_scored_whole() -> None:
    scorer = ItemValues([0.0, 1.0, 2.0, 3.0])
    split = EvalSplit(Jagged.from_lists([[1]]), torch.tensor([2]), torch.tensor([1]))
    evaluate(scorer, split, num_items=3, config=EvalConfig(ks=(1,), item_block=3))
    assert scorer.whole_catalogue_calls == 1


def test_item_blocks_cover_every_item_once_with_the_padding_in_the_first() -> None:
    blocks = item_blocks(10, 4)
    assert blocks == [(0, 5), (5, 9), (9, 11)]
    assert [i for first, stop in blocks for i in range(first, stop)] == list(range(11))
