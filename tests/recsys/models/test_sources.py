"""Candidate sources (recsys.models.sources): the union of each source's top-N by hand, the features each candidate
carries, a failing source skipped, and a ranker over three sources that trains, proposes items no first stage was
trained on, and saves and loads whole."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.errors import ConfigError
from recsys.models.family import ModelInputs, Upstream
from recsys.models.generative import GenerativeConfig, GenerativeRetriever
from recsys.models.ranker import Ranker, RankerConfig, TwoStageRanker
from recsys.models.registry import build_model, load_model, save_model
from recsys.models.sources import (
    CandidateSource,
    check_sources,
    content_neighbours,
    gather_rows,
    neighbour_scores,
    propose,
    recent_cosine,
    untrained_scores,
)
from recsys.training.averaging import WeightAverage
from recsys.training.recipes import RankerRecipe, RankerTraining, RecipeInputs, recipe_for
from recsys.training.trainer import fit
from tests.conftest import quick_train
from tests.recsys.models.test_ranker import EVAL

INF = float("inf")
RETRIEVER, CONTENT, NEW = (
    CandidateSource("retriever", 2),
    CandidateSource("content", 2),
    CandidateSource("new_items", 1),
)


def test_the_union_is_deduplicated_ordered_by_best_position_and_padded() -> None:
    # items 1..5; the retriever likes 1 then 2, the content 2 then 4, and the only untrained item is 5
    retriever = torch.tensor([[-INF, 5.0, 4.0, 1.0, 0.5, 0.0], [-INF, 5.0, 4.0, 1.0, 0.5, 0.0]])
    cosine = torch.tensor([[-INF, 0.1, 0.9, 0.2, 0.8, 0.3], [-INF, 0.1, 0.9, 0.2, 0.8, -INF]])
    untrained = torch.tensor([False, False, False, False, False, True])
    found, calls = propose([RETRIEVER, CONTENT, NEW], scores_of(retriever, cosine, untrained=untrained),
                           cosines_of(cosine), untrained)  # fmt: skip
    assert [c.source for c in calls] == ["retriever", "content", "new_items"] and not any(c.failed for c in calls)
    # row 0: 1 and 2 and 5 first in a source, then 4 (second in content); row 1's cosine cannot propose item 5
    assert sorted(found.items[0, :3].tolist()) == [1, 2, 5] and found.items[0, 3] == 4
    assert sorted(found.items[1, :2].tolist()) == [1, 2] and found.items[1].tolist()[2:] == [4, 0]
    row = {item: found.features[0, c].tolist() for c, item in enumerate(found.items[0].tolist())}
    assert row[2] == pytest.approx([1 / 2, 1.0, 0.0, 0.9, 0.0])  # 2nd of the retriever, 1st of content; trained
    assert row[5] == pytest.approx([0.0, 0.0, 1.0, 0.3, 0.3])  # only the new-items source proposed it
    # the retriever's own scores, but item 5, untrained, enters as its last candidate (2nd of its top 2: item 2)
    expected = [retriever[0, i].item() if i != 5 else retriever[0, 2].item() for i in found.items[0].tolist()]
    assert found.retrieval[0].tolist() == expected
    assert found.retrieval[1, 3] == found.retrieval[1, :3].min()  # padding: the row's lowest real score
    assert found.features[1, 3].abs().sum() == 0 and found.real[1].tolist() == [True, True, True, False]


def test_the_first_stages_never_propose_an_untrained_item_whatever_its_score() -> None:
    """An untrained item's first-stage score comes from an untrained vector: noise, here the highest. Only the
    content kinds propose it, and it enters with the retriever's last candidate's score."""
    retriever = torch.tensor([[-INF, 5.0, 4.0, 1.0, 0.5, 9.0]])
    model = torch.tensor([[-INF, 0.0, -1.0, 3.0, -INF, 8.0]])
    cosine = torch.tensor([[-INF, 0.1, 0.9, 0.2, 0.8, 0.3]])
    untrained = torch.tensor([False, False, False, False, False, True])
    sources = [RETRIEVER, CandidateSource("model", 2, index=0, label="hstu"), NEW]
    found, _ = propose(sources, scores_of(retriever, cosine, model, untrained), cosines_of(cosine), untrained)
    row = {item: found.features[0, c].tolist() for c, item in enumerate(found.items[0].tolist())}
    assert row[5][:3] == pytest.approx([0.0, 0.0, 1.0])  # proposed by new_items alone
    assert row[1][:2] == pytest.approx([1.0, 0.5]) and row[3][1] == pytest.approx(1.0)  # the trained items: tops
    assert found.retrieval[0, found.items[0].tolist().index(5)] == retriever[0, 2]  # the retriever's 2nd: item 2


def scores_of(
    retriever: torch.Tensor,
    cosine: torch.Tensor,
    model: torch.Tensor | None = None,
    untrained: torch.Tensor | None = None,
) -> Callable[[CandidateSource], torch.Tensor]:
    """What the ranker's `score` callback gives each source: the retriever's or the model's scores, the cosines (the
    untrained items' alone for new_items)."""

    def score(source: CandidateSource) -> torch.Tensor:
        if source.kind == "retriever":
            return retriever
        if source.kind == "model":
            assert model is not None
            return model
        if source.kind == "new_items":
            assert untrained is not None
            return cosine.masked_fill(~untrained, -INF)
        return cosine

    return score


def cosines_of(cosine: torch.Tensor) -> Callable[[CandidateSource, torch.Tensor], torch.Tensor]:
    """What the ranker's `cosine` callback gives a content kind: the candidates' cosines."""
    return lambda source, items: cosine.gather(1, items)


def test_a_model_source_adds_its_top_and_its_score_gap() -> None:
    retriever = torch.tensor([[-INF, 5.0, 4.0, 1.0, 0.5]])
    model = torch.tensor([[-INF, 0.0, -1.0, 3.0, -INF]])  # a beam search: item 4 not reachable
    sources = [RETRIEVER, CandidateSource("model", 2, index=0, label="hstu")]
    found, calls = propose(sources, scores_of(retriever, retriever, model), cosines_of(retriever), None)
    assert [c.source for c in calls] == ["retriever", "hstu"]
    row = {item: found.features[0, c].tolist() for c, item in enumerate(found.items[0].tolist())}
    assert set(row) == {1, 2, 3}  # the retriever's 1, 2 and the model's 3, 1
    assert row[3] == pytest.approx([0.0, 1.0, 0.0]) and row[1] == pytest.approx([1.0, 0.5, -3.0])
    assert row[2] == pytest.approx([0.5, 0.0, 0.0])  # not proposed by the model: no gap


def test_the_union_matches_a_whole_catalogue_reference_ties_by_item() -> None:
    """The union works on the sources' tops alone; here against every item's best position computed over the whole
    catalogue (a (B, V+1) table per source), on ranks that tie across sources, -inf scores and untrained items."""
    torch.manual_seed(0)
    B, V1 = 6, 40
    retriever, model, cosine = torch.randn(B, V1), torch.randn(B, V1), torch.rand(B, V1)
    model[:, ::3] = -INF  # a model that cannot reach every item
    cosine[:2, 20:] = -INF  # content that proposes fewer than its top
    retriever[:, 0] = model[:, 0] = cosine[:, 0] = -INF
    untrained = torch.zeros(V1, dtype=torch.bool)
    untrained[[5, 17, 33]] = True
    sources = [CandidateSource("retriever", 8), CandidateSource("model", 6, index=0), CandidateSource("content", 25),
               CandidateSource("new_items", 2)]  # fmt: skip
    score = scores_of(retriever, cosine, model, untrained)
    found, _ = propose(sources, score, cosines_of(cosine), untrained)

    def positions(source: CandidateSource) -> torch.Tensor:  # (B, V+1) 1 / (1 + position) in its top, else 0
        scores = score(source)
        if source.kind in ("retriever", "model"):
            scores = scores.masked_fill(untrained, -INF)
        top = scores.topk(source.top, dim=1)
        weight = (1.0 / torch.arange(1, source.top + 1)) * top.values.isfinite()
        return torch.zeros(B, V1).scatter_(1, top.indices, weight)

    table = torch.stack([positions(source) for source in sources], dim=-1)  # (B, V+1, sources)
    best = table.amax(dim=-1)
    for row in range(B):
        proposed = sorted(best[row].nonzero().squeeze(1).tolist(), key=lambda item: (-best[row, item].item(), item))
        items = found.items[row].tolist()
        assert items[: len(proposed)] == proposed and not any(items[len(proposed) :]), row  # ties: lower item first
        features = found.features[row, : len(proposed), : len(sources)]
        torch.testing.assert_close(features, table[row, proposed])
    assert found.items.shape[1] == int((best > 0).sum(dim=1).max())
    assert (best > 0).sum(dim=1).unique().numel() > 1  # rows of different widths: the padding was exercised


CORNERS = torch.nn.functional.normalize(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), dim=-1)


def test_recent_cosine_is_the_cosine_to_the_closest_recent_item() -> None:
    histories = torch.tensor([[0, 1, 2], [0, 0, 0], [2, 1, 3]])
    every = torch.tensor([1, 2, 3])  # the same items for every row
    assert recent_cosine(CORNERS, histories, 1, every)[0].tolist() == pytest.approx([0.0, 1.0, 2**-0.5])  # 2 only
    assert recent_cosine(CORNERS, histories, 1, every)[1].tolist() == [0.0, 0.0, 0.0]  # an empty history
    assert recent_cosine(CORNERS, histories, 2, every)[0].tolist() == pytest.approx([1.0, 1.0, 2**-0.5])
    per_row = torch.tensor([[3, 1], [1, 1], [3, 2]])  # each row its own candidates
    expected = torch.tensor([[2**-0.5, 1.0], [0.0, 0.0], [1.0, 2**-0.5]])
    torch.testing.assert_close(recent_cosine(CORNERS, histories, 2, per_row), expected)


def test_gather_rows_is_advanced_indexing_for_any_index_shape() -> None:
    torch.manual_seed(0)
    table = torch.randn(50, 7)
    for index in (torch.tensor([3, 0, 49, 3]), torch.randint(0, 50, (4, 6)), torch.randint(0, 50, (2, 3, 5))):
        assert torch.equal(gather_rows(table, index), table[index])
    rows = gather_rows(table, torch.tensor([[1, 2]]))
    rows[0, 0, 0] = 99.0  # a copy, as indexing gives: the table is untouched
    assert table[1, 0] != 99.0


def test_the_neighbour_table_gives_the_dense_top_n_exactly() -> None:
    torch.manual_seed(0)
    content = torch.nn.functional.normalize(torch.randn(301, 16), dim=-1)
    content[0] = 0.0
    histories = torch.randint(0, 301, (64, 12))
    histories[:3, :] = 0  # empty histories: nothing to propose
    histories[3:6, :-2] = 0  # short ones
    neighbours = content_neighbours(content, top=20, block_rows=37)  # blocks that do not divide the items
    assert neighbours.items.shape == (301, 20) and neighbours.cosines[0].eq(-INF).all()
    assert neighbours.items[1:, 0].tolist() == list(range(1, 301))  # an item is its own nearest
    for recent, top in ((1, 20), (5, 20), (5, 7)):
        scores = neighbour_scores(neighbours, histories, recent)
        dense = recent_cosine(content, histories, recent, torch.arange(301)).masked_fill(
            (histories[:, -recent:] == 0).all(dim=1, keepdim=True), -INF
        )
        dense[:, 0] = -INF
        found, expected = scores.topk(top, dim=1), dense.topk(top, dim=1)
        assert torch.allclose(found.values, expected.values, atol=1e-6)  # the same top cosines, best first...
        proposed = found.values.isfinite()
        assert torch.allclose(dense.gather(1, found.indices)[proposed], found.values[proposed], atol=1e-6)  # ...theirs
        assert scores[:3].eq(-INF).all()


def test_new_items_are_scored_among_the_untrained_items_alone() -> None:
    histories = torch.tensor([[0, 1, 2], [0, 0, 0]])
    untrained = torch.tensor([False, False, False, True])
    scores = untrained_scores(CORNERS, histories, 2, untrained)
    assert scores[0, :3].eq(-INF).all() and scores[0, 3].item() == pytest.approx(2**-0.5)
    assert scores[1].eq(-INF).all()  # an empty history proposes nothing


def test_a_failing_source_is_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    retriever = torch.tensor([[-INF, 3.0, 2.0, 1.0]])

    def broken(source: CandidateSource) -> torch.Tensor:
        if source.kind == "retriever":
            return retriever
        raise RuntimeError("content store unreachable")

    with caplog.at_level(logging.ERROR, logger="recsys.models.sources"):
        found, calls = propose([RETRIEVER, CONTENT], broken, cosines_of(retriever), None)
    assert "candidate source content failed" in caplog.text and "content store unreachable" in caplog.text
    assert [(c.source, c.failed) for c in calls] == [("retriever", False), ("content", True)]
    assert found.items[0].tolist() == [1, 2] and found.features[0, :, 1:].abs().sum() == 0


def test_a_content_source_whose_cosine_fails_keeps_its_proposals_without_it(caplog: pytest.LogCaptureFixture) -> None:
    retriever = torch.tensor([[-INF, 3.0, 2.0, 1.0]])
    cosine = torch.tensor([[-INF, 0.1, 0.2, 0.9]])

    def broken(source: CandidateSource, items: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of memory")

    with caplog.at_level(logging.ERROR, logger="recsys.models.sources"):
        found, calls = propose([RETRIEVER, CONTENT], scores_of(retriever, cosine), broken, None)
    assert "candidate source content failed" in caplog.text and [c.failed for c in calls] == [False, True]
    assert sorted(found.items[0].tolist()) == [1, 2, 3]  # 3: the content's first, proposed before the failure
    assert found.features[0, :, 2].abs().sum() == 0  # no cosine


@pytest.mark.parametrize(
    ("sources", "problem"),
    [
        ([RETRIEVER, RETRIEVER], "named more than once"),
        ([CONTENT], "list the retriever once"),
        ([RETRIEVER, CandidateSource("model", 5, index=1)], r"extra retrievers \[1\].* has 1"),
        ([RETRIEVER], r"extra retrievers \[\].* has 1"),  # an extra retriever no source uses
    ],
)
def test_a_source_list_names_the_retriever_once_and_every_extra_retriever(
    sources: list[CandidateSource], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        check_sources(sources, extra_retrievers=1)


def test_a_ranker_over_three_sources_trains_proposes_new_items_and_loads_whole(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    content = torch.cat([torch.zeros(1, 8), torch.randn(data.num_items, 8)])
    counts = data.item_counts().clone()
    counts[[3, 7]] = 0  # two items the first stage never trained on
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    inputs = ModelInputs(retriever=retriever, content=content, item_counts=counts)
    sources = [{"kind": "retriever", "top": 10}, {"kind": "content", "top": 5, "recent": 3},
               {"kind": "new_items", "top": 2}]  # fmt: skip
    params = {"dim": 32, "hidden": 64, "use_content": True, "residual": True, "sources": sources}
    with pytest.raises(ConfigError, match="use_content"):
        build_model("ranker", {**params, "use_content": False}, data.num_items, inputs)
    model = build_model("ranker", params, data.num_items, inputs)
    assert isinstance(model, TwoStageRanker) and model.untrained is not None
    assert model.untrained.nonzero().squeeze(1).tolist() == [3, 7]
    histories = data.eval_split("test").histories.select(torch.arange(6)).to_padded(20)
    scores = model.eval().score(histories)
    assert torch.isfinite(scores[:, [3, 7]]).all()  # the new items are candidates of every row
    assert (torch.isfinite(scores).sum(dim=1) <= 10 + 5 + 2).all() and not torch.isfinite(scores[:, 0]).any()
    assert [call.source for call in model.last_source_calls] == ["retriever", "content", "new_items"]
    neighbours = model.content_neighbours()
    assert model.train().eval().content_neighbours() is neighbours  # of the content alone: kept across modes
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the trainer evaluates on a GPU
        under_bf16 = model.score(histories)
    assert not any(call.failed for call in model.last_source_calls)  # no source skipped for a dtype
    # the same candidates, but where bf16 rounds two of the retriever's scores into a tie at its 10th place (the
    # content kinds' cosines stay fp32): at most one swapped candidate a row, per CPU's bf16 kernels
    differ = (under_bf16.isfinite() != scores.isfinite()).sum(dim=1)
    assert (differ <= 2).all() and torch.isfinite(under_bf16[:, [3, 7]]).all(), differ.tolist()

    twin = recipe_for(model, data, 32, RankerTraining(), RecipeInputs(holdout_retriever=model.retriever))
    assert isinstance(twin, RankerRecipe) and twin.holdout_untrained is not None  # what the twin never saw:
    rows = data.training_sequences()
    seen_before_last = set(rows.truncate_last(1).values.tolist())
    only_last = set(range(1, data.num_items + 1)) - seen_before_last
    assert set(twin.holdout_untrained.nonzero().squeeze(1).tolist()) == only_last  # items only in last places
    batch = next(iter(twin.batches(data.training_rows(), torch.Generator())))
    loss, pairs = twin.loss(model.train(), batch, torch.Generator())
    assert pairs > 0 and torch.isfinite(loss)

    recipe = recipe_for(model, data, 32, RankerTraining(train_candidates=8), RecipeInputs())
    assert isinstance(recipe, RankerRecipe)
    before = {k: v.clone() for k, v in model.ranker.state_dict().items()}
    fit(model, data, quick_train(1, 32, 3e-3), EVAL, recipe)
    assert any(not torch.equal(before[k], v) for k, v in model.ranker.state_dict().items())  # it learned
    save_model(tmp_path / "ranker.pt", model)
    _, loaded = load_model(tmp_path / "ranker.pt")
    assert isinstance(loaded, TwoStageRanker) and torch.equal(loaded.untrained, model.untrained)
    torch.testing.assert_close(loaded.score(histories), model.eval().score(histories))


def test_the_new_item_prior_lifts_the_new_candidates_alone_when_scoring(
    tiny_data_dir: Path, retriever_dir: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    content = torch.cat([torch.zeros(1, 8), torch.randn(data.num_items, 8)])
    counts = data.item_counts().clone()
    counts[[3, 7]] = 0
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    inputs = ModelInputs(retriever=retriever, content=content, item_counts=counts)
    sources = [{"kind": "retriever", "top": 10}, {"kind": "new_items", "top": 2}]
    params = {"dim": 32, "hidden": 64, "use_content": True, "residual": True, "sources": sources}
    with pytest.raises(ConfigError, match="no source proposes them"):
        build_model("ranker", {**params, "sources": sources[:1], "new_item_prior": 2.0}, data.num_items, inputs)
    torch.manual_seed(1)
    plain = build_model("ranker", params, data.num_items, inputs).eval()
    torch.manual_seed(1)
    lifted = build_model("ranker", {**params, "new_item_prior": 2.5}, data.num_items, inputs).eval()
    histories = data.eval_split("test").histories.select(torch.arange(6)).to_padded(20)
    before, after = plain.score(histories), lifted.score(histories)
    new = torch.zeros(data.num_items + 1, dtype=torch.bool)
    new[[3, 7]] = True
    torch.testing.assert_close(after[:, new], before[:, new] + 2.5)  # every row's new candidates, by the prior
    torch.testing.assert_close(after[:, ~new], before[:, ~new])  # the trained ones (and -inf elsewhere) as they were


def test_a_ranker_reads_an_extra_retriever_as_a_model_source(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    sources = [{"kind": "retriever", "top": 8}, {"kind": "model", "index": 0, "top": 4, "label": "second"}]
    params = {"dim": 32, "hidden": 64, "sources": sources}
    with pytest.raises(ConfigError, match="extra_retrievers has 0"):
        build_model("ranker", params, data.num_items, ModelInputs(retriever=retriever))
    with pytest.raises(ConfigError, match="does not use them"):
        unused = ModelInputs(retriever=retriever, extra_retrievers=(retriever,))
        build_model("ranker", {"dim": 32, "hidden": 64}, data.num_items, unused)
    model = build_model(
        "ranker", params, data.num_items, ModelInputs(retriever=retriever, extra_retrievers=(retriever,))
    )
    assert isinstance(model, TwoStageRanker) and model.extra_retriever_count == 1
    histories = data.eval_split("test").histories.select(torch.arange(5)).to_padded(20)
    model.eval().score(histories)
    assert [call.source for call in model.last_source_calls] == ["retriever", "second"]
    with pytest.raises(ValueError, match="extra_holdout_retrievers"):  # its candidates would hold the targets
        recipe_for(model, data, 32, RankerTraining(), RecipeInputs(holdout_retriever=model.retriever))
    twins = RecipeInputs(holdout_retriever=model.retriever, extra_holdout_retrievers=(model.retriever,))
    recipe = recipe_for(model, data, 32, RankerTraining(), twins)
    batch = next(iter(recipe.batches(data.training_rows(), torch.Generator())))
    loss, pairs = recipe.loss(model.train(), batch, torch.Generator())
    assert pairs > 0 and torch.isfinite(loss)
    save_model(tmp_path / "ranker.pt", model)
    _, loaded = load_model(tmp_path / "ranker.pt")  # both first stages rebuilt from the saved config
    assert isinstance(loaded, TwoStageRanker) and loaded.extra_retriever_count == 1
    torch.testing.assert_close(loaded.score(histories), model.eval().score(histories))


def test_the_generative_retriever_is_a_model_source_its_beams_the_candidates(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    """A generative retriever proposes its beams (its scores are -inf outside them): a ranker over it scores, saves
    and loads whole, the generative stage rebuilt with its codes."""
    data = load_prepared(tiny_data_dir)
    sizes = (8, 8, 4)
    combos = torch.cartesian_prod(*(torch.arange(k) for k in sizes))
    codes = torch.cat(
        [
            torch.zeros(1, 3, dtype=torch.long),
            combos[torch.randperm(len(combos), generator=torch.Generator().manual_seed(0))[: data.num_items]],
        ]
    )
    config = GenerativeConfig(num_items=data.num_items, codebook_sizes=sizes, dim=16, num_heads=2, ffn_dim=32,
                              num_encoder_layers=1, num_decoder_layers=1, beam_size=6)  # fmt: skip
    save_model(tmp_path / "generative.pt", GenerativeRetriever(config, codes))
    generative = Upstream(*load_model(tmp_path / "generative.pt"))
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    sources = [{"kind": "retriever", "top": 8}, {"kind": "model", "index": 0, "top": 6, "label": "generative"}]
    inputs = ModelInputs(retriever=retriever, extra_retrievers=(generative,))
    model = build_model("ranker", {"dim": 32, "hidden": 64, "sources": sources}, data.num_items, inputs)
    assert isinstance(model, TwoStageRanker)
    histories = data.eval_split("test").histories.select(torch.arange(5)).to_padded(20)
    beams = model.extra_retrievers[0].score(histories).isfinite()  # (B, V+1): the 6 beams of each user
    assert (beams.sum(dim=1) == 6).all()
    found = model.eval().candidates(histories, None)
    proposed = torch.zeros_like(beams).scatter_(1, found.items, True)
    assert (proposed[:, 1:] >= beams[:, 1:]).all()  # every beam is a candidate
    save_model(tmp_path / "ranker.pt", model)
    _, loaded = load_model(tmp_path / "ranker.pt")
    torch.testing.assert_close(loaded.score(histories), model.score(histories))


def test_without_gradients_item_vectors_are_rows_of_a_table_kept_until_a_weight_changes() -> None:
    torch.manual_seed(0)
    config = RankerConfig(num_items=30, dim=8, hidden=16, use_content=True, content_dim=12, category_sizes=(3,),
                          use_categories=True)  # fmt: skip
    ranker = Ranker(config, torch.randn(31, 12), torch.randint(0, 4, (31, 1))).eval()
    for embedding in ranker.category_emb:
        torch.nn.init.normal_(embedding.weight)  # zero at the start: make the levels count
    items = torch.tensor([[3, 0, 7], [30, 1, 1]])
    row_by_row = ranker.item_vectors(items)  # gradients on: projected per call
    built = []
    rows = ranker._item_vectors
    ranker._item_vectors = lambda asked: built.append(asked.shape) or rows(asked)  # type: ignore[method-assign]
    with torch.no_grad():
        first = ranker.item_vectors(items)
        torch.testing.assert_close(first, row_by_row.detach())
        torch.testing.assert_close(ranker.item_vectors(items), first)
        assert built == [(31,)]  # one table of every item, kept for the second call...
        ranker.content_proj.weight.mul_(2.0)  # ...until a weight changes (an optimizer step, a load)
        changed = ranker.item_vectors(items)
        assert built == [(31,), (31,)] and not torch.allclose(changed, first)
        torch.testing.assert_close(changed, rows(items))


def test_an_untrained_item_is_read_without_its_id_vector() -> None:
    torch.manual_seed(0)
    content = torch.randn(31, 12)
    config = RankerConfig(num_items=30, dim=8, hidden=16, use_content=True, content_dim=12)
    ranker = Ranker(config, content).eval()
    untrained = torch.zeros(31, dtype=torch.bool)
    untrained[[3, 30]] = True
    items = torch.tensor([[3, 0, 7], [30, 1, 3]])
    for grad in (True, False):  # projected per call, and rows of the kept table
        with torch.set_grad_enabled(grad):
            vectors = ranker.item_vectors(items, untrained)
            content_alone = ranker.content_proj(ranker.content[items])  # as stored: normalised
            torch.testing.assert_close(vectors[untrained[items]], content_alone[untrained[items]])
            torch.testing.assert_close(vectors[~untrained[items]], ranker.item_vectors(items)[~untrained[items]])


def test_new_item_rate_hands_the_ranker_a_fresh_share_of_items_as_new_each_batch(
    tiny_data_dir: Path, retriever_dir: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    content = torch.cat([torch.zeros(1, 8), torch.randn(data.num_items, 8)])
    inputs = ModelInputs(retriever=retriever, content=content, item_counts=data.item_counts())
    params = {"dim": 32, "hidden": 64, "use_content": True, "residual": True}
    single = build_model("ranker", params, data.num_items, inputs)
    with pytest.raises(ValueError, match="new_items source"):
        recipe_for(single, data, 32, RankerTraining(new_item_rate=0.2), RecipeInputs())
    sources = [{"kind": "retriever", "top": 10}, {"kind": "new_items", "top": 5, "recent": 3}]
    model = build_model("ranker", {**params, "sources": sources}, data.num_items, inputs)
    recipe = recipe_for(model, data, 32, RankerTraining(new_item_rate=0.3), RecipeInputs())
    assert isinstance(recipe, RankerRecipe) and isinstance(model, TwoStageRanker) and model.untrained is not None
    generator = torch.Generator().manual_seed(0)
    draws = [recipe._with_new_items(model.untrained, generator) for _ in range(2)]
    for drawn in draws:
        assert not drawn[0] and 0.2 < drawn[1:].float().mean().item() < 0.4
    assert not torch.equal(draws[0], draws[1])  # afresh for each batch
    batch = next(iter(recipe.batches(data.training_rows(), torch.Generator())))
    loss, pairs = recipe.loss(model.train(), batch, generator)
    assert pairs > 0 and torch.isfinite(loss)


@pytest.mark.parametrize("write", ["fused optimizer step", "weight average applied", "state-dict load"])
def test_the_item_table_follows_weights_written_without_moving_their_version(write: str) -> None:
    """A fused Adam step writes the weights without moving `Tensor._version`; the trainer's mode switches around it
    (train() to step, eval() to validate) drop the table, as a load and the weight average's swap do."""
    torch.manual_seed(0)
    ranker = Ranker(RankerConfig(num_items=30, dim=8, hidden=16)).eval()
    items = torch.tensor([[3, 0, 7], [30, 1, 1]])
    with torch.no_grad():
        before = ranker.item_vectors(items)
    if write == "fused optimizer step":
        optimizer = torch.optim.Adam(ranker.parameters(), lr=0.1, fused=True)
        ranker.train()
        ranker.item_vectors(items).sum().backward()
        optimizer.step()
        ranker.eval()
    elif write == "weight average applied":
        average = WeightAverage(ranker, decay=0.5)
        average.averages = [a + 1.0 for a in average.averages]
        context = average.applied()
        context.__enter__()
    else:
        ranker.load_state_dict(Ranker(RankerConfig(num_items=30, dim=8, hidden=16)).state_dict())
    with torch.no_grad():
        after = ranker.item_vectors(items)
        assert not torch.allclose(after, before)
        torch.testing.assert_close(after, ranker._item_vectors(items))
