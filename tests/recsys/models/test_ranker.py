"""Two-stage ranking: the retriever's top-C re-scored by a trained ranker; the retriever stays frozen, the
target the retriever misses counts as a miss, the data's other tasks are learned beside ranking, and the model
saves and loads whole."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import torch

from recsys.data.categories import CategoryTable, category_table
from recsys.data.prepared import SequenceData, load_prepared
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig, evaluate, evaluate_tasks
from recsys.models.family import ModelInputs, Upstream
from recsys.models.ranker import TwoStageRanker
from recsys.models.registry import build_model, load_model, save_model
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.recipes import NextItemTraining, RankerRecipe, RankerTraining, RecipeInputs, recipe_for
from recsys.training.trainer import fit
from tests.conftest import quick_train

EVAL = EvalConfig(ks=(10,))


def two_stage(
    retriever_dir: Path, num_items: int, content: torch.Tensor | None = None, data_tasks: tuple[str, ...] = (),
    categories: CategoryTable | None = None, **params: object,
) -> TwoStageRanker:  # fmt: skip
    """A ranker over the trained retriever, on a catalog with `content` embeddings, labels of `data_tasks` and
    `categories`."""
    torch.manual_seed(0)
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    inputs = ModelInputs(retriever=retriever, content=content, tasks=data_tasks, categories=categories)
    model = build_model("ranker", {"num_candidates": 20, "dim": 32, "hidden": 64, **params}, num_items, inputs)
    assert isinstance(model, TwoStageRanker)
    return model


def test_scores_are_the_rankers_on_the_retrievers_top_c_and_minus_inf_elsewhere(
    tiny_data_dir: Path, retriever_dir: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    model = two_stage(retriever_dir, data.num_items).eval()
    histories = data.eval_split("valid").histories.select(torch.arange(6)).to_padded(20)
    scores = model.score(histories)
    retrieved = model.retriever.score(histories)
    retrieved[:, 0] = float("-inf")
    top = set(map(tuple, retrieved.topk(20, dim=1).indices.sort(dim=1).values.tolist()))
    finite = set(map(tuple, torch.isfinite(scores).nonzero()[:, 1].view(6, 20).sort(dim=1).values.tolist()))
    assert finite == top  # exactly the retriever's top-20 per row are candidates


def test_training_the_ranker_improves_on_the_retriever_and_leaves_it_frozen(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    model = two_stage(retriever_dir, data.num_items)
    retriever_before = {k: v.clone() for k, v in model.retriever.state_dict().items()}
    first = evaluate(model.retriever, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    result = fit(
        model,
        data,
        quick_train(6, 32, 3e-3),
        EVAL,
    )
    for key, value in model.retriever.state_dict().items():
        torch.testing.assert_close(value, retriever_before[key], rtol=0, atol=0)
    assert result.best_valid["ndcg@10"] > first  # re-ranking its top-20 beats the retriever's own order
    assert_saves_and_loads_whole(model, data, tmp_path)


def test_the_moe_head_trains_with_balanced_experts(tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path) -> None:
    data = load_prepared(tiny_data_dir)
    model = two_stage(retriever_dir, data.num_items, head="moe", num_experts=4, top_k=2)
    assert model.ranker.moe is not None
    seen: list[dict[str, float]] = []
    train = quick_train(2, 32, 3e-3)
    recipe = recipe_for(model, data, train.optimization.batch_size, RankerTraining(train_candidates=10))
    result = fit(model, data, train, EVAL, recipe, lambda _, m: seen.append(m))
    assert [row["epoch"] for row in result.expert_load] == [1, 2]  # recorded every epoch, for the dashboard
    load = result.expert_load[-1]
    assert sum(load["fraction"]) == pytest.approx(1.0)
    assert float(load["max_over_mean"]) <= 1.5
    assert seen[-1]["expert_load_max_over_mean"] == load["max_over_mean"]  # logged with the epoch's metrics
    assert_saves_and_loads_whole(model, data, tmp_path)


def assert_saves_and_loads_whole(model: TwoStageRanker, data: SequenceData, tmp_path: Path) -> None:
    """The saved file rebuilds both stages (the retriever's config travels in the ranker's)."""
    save_model(tmp_path / "ranker.pt", model)
    name, loaded = load_model(tmp_path / "ranker.pt")
    histories = data.eval_split("test").histories.select(torch.arange(5)).to_padded(20)
    assert name == "ranker"
    torch.testing.assert_close(loaded.score(histories), model.eval().score(histories))


def test_a_ranker_needs_a_retriever_trained_on_the_same_items(tiny_data_dir: Path, retriever_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.upstream\.retriever"):
        build_model("ranker", {}, 10)
    retriever = Upstream(*load_model(retriever_dir / "model.pt"))
    with pytest.raises(ConfigError, match="same prepared data"):
        build_model("ranker", {}, 3, ModelInputs(retriever=retriever))


def test_training_pairs_the_retriever_missed_are_left_out(tiny_data_dir: Path, retriever_dir: Path) -> None:
    """Forcing a missed target in would give it an out-of-range retriever score: a shortcut the ranker
    would learn and never meet when serving."""
    from recsys.data.batching import HistoryBatch

    data = load_prepared(tiny_data_dir)
    model = two_stage(retriever_dir, data.num_items)
    histories = data.eval_split("valid").histories.select(torch.arange(8)).to_padded(20)
    scores = model.retriever.score(histories)
    scores[:, 0] = float("inf")  # never the worst
    best, worst = model.candidates(histories).items[:, 0], scores.argmin(dim=1)
    targets = torch.where(torch.arange(8) < 3, best, worst)  # 3 pairs the retriever found, 5 it missed
    recipe = RankerRecipe(max_history=20, batch_size=8, train_candidates=5)
    loss, count = recipe.loss(model, HistoryBatch(histories, targets, torch.arange(1, 9)), torch.Generator())
    assert count == 3 and torch.isfinite(loss)
    missed = HistoryBatch(histories, worst, torch.arange(1, 9))
    assert recipe.loss(model, missed, torch.Generator())[1] == 0


def test_a_ranker_trains_on_the_items_its_held_out_first_stage_never_saw(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    held_out = SASRec(SASRecConfig(num_items=data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64))
    train = quick_train(2, 4, 3e-3)
    holdout = recipe_for(held_out, data, train.optimization.batch_size, NextItemTraining(holdout_last=1))
    fit(held_out, data, train, EVAL, holdout)
    model = two_stage(retriever_dir, data.num_items)
    recipe = recipe_for(model, data, 1_000, RankerTraining(), RecipeInputs(holdout_retriever=held_out))
    assert isinstance(recipe, RankerRecipe) and recipe.holdout_retriever is not None
    rows = data.training_rows()
    (batch,) = recipe.batches(rows, torch.Generator())
    assert sorted(batch.targets.tolist()) == sorted(rows.items.last(1).tolist())  # one pair per user: the last item
    two = recipe_for(model, data, 10_000, RankerTraining(holdout_items=2), RecipeInputs(holdout_retriever=held_out))
    (pairs,) = two.batches(rows, torch.Generator())
    lengths = rows.items.lengths()
    assert len(pairs.targets) == int((lengths >= 2).sum() + (lengths >= 3).sum())
    retriever_before = {k: v.clone() for k, v in model.retriever.state_dict().items()}
    result = fit(
        model,
        data,
        quick_train(3, 32, 3e-3),
        EVAL,
        recipe,
    )
    assert result.best_valid["ndcg@10"] > 0
    for key, value in model.retriever.state_dict().items():  # the serving first stage stays as it was
        torch.testing.assert_close(value, retriever_before[key], rtol=0, atol=0)


def test_a_residual_ranker_starts_as_its_retriever_and_can_keep_its_item_vectors(
    tiny_data_dir: Path, retriever_dir: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    model = two_stage(retriever_dir, data.num_items, residual=True, freeze_item_embeddings=True)
    histories = data.eval_split("valid").histories.select(torch.arange(6)).to_padded(20)
    scores, top = model.eval().score(histories), model.candidates(histories)
    # before training, each candidate's score is its retriever score minus the row's best: the first stage's order
    torch.testing.assert_close(scores.gather(1, top.items), top.retrieval - top.retrieval[:, :1])
    items = model.ranker.item_emb.weight.clone()
    fit(
        model,
        data,
        quick_train(1, 32, 3e-3),
        EVAL,
    )
    assert torch.equal(model.ranker.item_emb.weight, items)  # frozen: still the retriever's vectors
    assert not torch.equal(model.eval().score(histories), scores)  # the head learned a correction


def test_validated_before_training_a_residual_ranker_cannot_end_below_its_retriever(
    tiny_data_dir: Path, retriever_dir: Path
) -> None:
    """`train.schedule.validate_initial`: epoch 0 is the retriever's own order, so a training that does not help (here a
    learning rate of 30) leaves the two stages exactly as the retriever ranks."""
    data = load_prepared(tiny_data_dir)
    retriever = Upstream(*load_model(retriever_dir / "model.pt")).model.eval()
    valid = data.eval_split("valid")
    retriever_valid = evaluate(retriever, valid, data.num_items, EVAL).metrics["ndcg@10"]
    model = two_stage(retriever_dir, data.num_items, residual=True, freeze_item_embeddings=True)
    histories = valid.histories.select(torch.arange(6)).to_padded(20)
    before = model.eval().score(histories)
    quick = quick_train(2, 32, 30.0)
    config = dataclasses.replace(quick, schedule=dataclasses.replace(quick.schedule, validate_initial=True))
    seen: dict[int, dict[str, float]] = {}
    result = fit(model, data, config, EVAL, on_epoch_end=lambda epoch, metrics: seen.setdefault(epoch, metrics))
    assert sorted(seen) == [0, 1, 2] and "loss" not in seen[0]  # epoch 0: validated, not trained
    assert seen[0]["ndcg@10"] == pytest.approx(retriever_valid)  # it starts as its retriever ranks
    assert max(seen[1]["ndcg@10"], seen[2]["ndcg@10"]) <= seen[0]["ndcg@10"]  # the training did not help...
    assert result.best_epoch == 0 and result.best_valid["ndcg@10"] == seen[0]["ndcg@10"]
    torch.testing.assert_close(model.eval().score(histories), before)  # ...and the retriever's order is kept


def test_content_features_are_cosines_to_the_history_and_travel_with_the_model(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    with pytest.raises(ConfigError, match="reads content embeddings and none were built"):
        two_stage(retriever_dir, data.num_items, use_content=True)
    generator = torch.Generator().manual_seed(0)
    vectors = torch.randn(data.num_items, 6, generator=generator)
    content = torch.cat([torch.zeros(1, 6), vectors])  # row 0: the padding item
    model = two_stage(retriever_dir, data.num_items, content=content, use_content=True)
    assert model.config.content_dim == 6
    unit = torch.nn.functional.normalize(vectors, dim=1)
    histories, candidates = torch.tensor([[0, 1, 2], [0, 0, 0]]), torch.tensor([[3, 1], [4, 5]])
    similarities = model.ranker.content_similarities(histories, candidates)  # (2, 2, 3)
    cosine = unit[[2, 0]] @ unit[[0, 1]].T  # candidates 3, 1 against history items 1, 2 (item i is row i - 1)
    expected = torch.stack([cosine[:, 1], cosine.max(dim=1).values, cosine.mean(dim=1)], dim=-1)
    torch.testing.assert_close(similarities[0], expected)
    assert torch.equal(similarities[1], torch.zeros(2, 3))  # an empty history: no similarity
    fit(
        model,
        data,
        quick_train(1, 32, 3e-3),
        EVAL,
    )
    assert_saves_and_loads_whole(model, data, tmp_path)  # the content embeddings are in the saved model


def test_a_multi_task_ranker_learns_every_task_the_data_has(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    assert data.tasks == ("event:purchase", "value")  # the synthetic data's purchases and ratings
    model = two_stage(retriever_dir, data.num_items, data_tasks=data.tasks, head="moe", num_experts=4, top_k=2)
    assert [task.name for task in model.tasks] == list(data.tasks) and len(model.ranker.outputs) == 3
    split = data.eval_split("valid")
    before = evaluate_tasks(model.eval(), split)
    fit(
        model,
        data,
        quick_train(3, 32, 3e-3),
        EVAL,
    )
    after = evaluate_tasks(model, split)
    assert after["event:purchase"]["auc"] > 0.5 and after["event:purchase"]["users"] == len(split.targets)
    assert after["value"]["rmse"] < before["value"]["rmse"] / 2  # from an untrained head's 0 to ratings of 1-5
    assert_saves_and_loads_whole(model, data, tmp_path)
    _, loaded = load_model(tmp_path / "ranker.pt")
    histories, items = split.histories.select(torch.arange(4)).to_padded(20), split.targets[:4]
    torch.testing.assert_close(loaded.task_predictions(histories, items), model.task_predictions(histories, items))
    with pytest.raises(ConfigError, match="no labels for"):
        two_stage(retriever_dir, data.num_items, data_tasks=data.tasks, tasks=("event:refund",))


def tiny_categories(data: SequenceData) -> CategoryTable:
    """Category paths for the tiny synthetic items: 3 top levels, 2 below each (by item index), an item without."""
    paths = [None if idx == 1 else [f"Top{idx % 3}", f"Sub{idx % 2}"] for idx in data.items["item_idx"].to_list()]
    table = category_table(data.items.with_columns(category_path=pl.Series(paths, dtype=pl.List(pl.String))))
    assert table is not None
    return table


def test_category_levels_enter_the_item_vectors_are_predicted_and_travel_with_the_model(
    tiny_data_dir: Path, retriever_dir: Path, tmp_path: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    assert category_table(data.items) is None  # no data.attributes.categories: no table
    with pytest.raises(ConfigError, match=r"data\.attributes\.categories"):
        two_stage(retriever_dir, data.num_items, use_categories=True)
    table = tiny_categories(data)
    assert table.sizes[:3] == (3, 6, 0) and table.ids[1].tolist() == [0] * 8  # "Top0 > Sub1" != "Top1 > Sub1"
    model = two_stage(
        retriever_dir, data.num_items, categories=table, use_categories=True, category_tasks=True,
        head="moe", num_experts=4, top_k=2,
    )  # fmt: skip
    assert model.config.category_sizes == (3, 6)  # 3 levels asked, the paths have 2
    assert model.category_tasks == ("category_l1", "category_l2") and model.ranker.moe is not None
    assert len(model.ranker.moe.routers) == 3  # ranking + a gate per category task
    before = model.ranker.item_vectors(torch.tensor([2, 3]))  # zero category embeddings: the item vectors as given
    torch.testing.assert_close(before, model.ranker.item_emb(torch.tensor([2, 3])))
    split = data.eval_split("valid")
    fit(model, data, quick_train(2, 32, 3e-3), EVAL)
    assert model.ranker.category_emb[0].weight.abs().sum() > 0  # learned
    report = evaluate_tasks(model.eval(), split)
    levels = model.item_categories(split.targets)
    last_levels = model.item_categories(split.histories.values[split.histories.offsets[1:] - 1])  # latest items
    for k, name in enumerate(model.category_tasks):
        known = levels[:, k] > 0
        assert 0.0 <= report[name]["accuracy"] <= 1.0
        assert report[name]["users"] == float(known.sum())
        same_as_last = (last_levels[:, k] == levels[:, k])[known].float().mean()
        assert report[name]["last_item_accuracy"] == pytest.approx(float(same_as_last))
        most_common = Counter(levels[known, k].tolist()).most_common(1)[0][1]
        assert report[name]["majority_accuracy"] == pytest.approx(most_common / float(known.sum()))
    assert set(report) == {"category_l1", "category_l2"}  # no data tasks given to this one
    assert_saves_and_loads_whole(model, data, tmp_path)  # the category table is in the saved model
    _, loaded = load_model(tmp_path / "ranker.pt")
    histories, items = split.histories.select(torch.arange(4)).to_padded(20), split.targets[:4]
    torch.testing.assert_close(loaded.category_hits(histories, items), model.category_hits(histories, items))


def test_only_category_features_no_tasks_and_the_dense_head(tiny_data_dir: Path, retriever_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    model = two_stage(retriever_dir, data.num_items, categories=tiny_categories(data), use_categories=True,
                      category_levels=1, tasks=())  # fmt: skip
    assert model.config.category_sizes == (3,) and model.category_tasks == () and not model.ranker.category_outputs
    fit(model, data, quick_train(1, 32, 3e-3), EVAL)
    assert evaluate_tasks(model.eval(), data.eval_split("valid")) == {}
