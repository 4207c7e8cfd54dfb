"""Two-tower retrieval: torchrec sparse features, logQ-corrected mixed negatives, learning, saving and loading."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.batching import HistoryBatch
from recsys.data.prepared import load_prepared
from recsys.errors import ConfigError, RecsysError
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.registry import load_model, save_model
from recsys.models.two_tower import TwoTower, TwoTowerConfig, _jagged
from recsys.runtime.checkpoint import load_checkpoint, save_checkpoint
from recsys.training.recipes import NextItemRecipe, TwoTowerRecipe, TwoTowerTraining, recipe_for
from recsys.training.trainer import fit
from tests.conftest import popularity_valid_metric, quick_train

EVAL = EvalConfig(ks=(10,))


def small(num_items: int = 12, **overrides: object) -> TwoTower:
    torch.manual_seed(0)
    codes = torch.randint(0, 3, (num_items + 1, 2))
    content = torch.randn(num_items + 1, 5)
    config = TwoTowerConfig(num_items=num_items, max_history=6, dim=8, hidden_dim=16, sid_levels=2, user_buckets=4,
                            use_content=True, content_dim=5, **overrides)  # fmt: skip
    return TwoTower(config, codes, content).eval()


def test_padded_rows_become_jagged_bags_without_the_padding() -> None:
    kjt = _jagged({"history": torch.tensor([[0, 0, 3], [1, 2, 4]]), "recent": torch.tensor([[3], [4]])})
    assert kjt.keys() == ["history", "recent"]
    assert kjt.lengths().tolist() == [1, 3, 1, 1]
    assert kjt.values().tolist() == [3, 1, 2, 4, 3, 4]


def test_user_vector_ignores_left_padding_and_reads_only_max_history_items() -> None:
    model = small()
    short = model.encode_queries(torch.tensor([[3, 4, 5]]), torch.tensor([2]))
    padded = model.encode_queries(torch.tensor([[0, 0, 0, 3, 4, 5]]), torch.tensor([2]))
    torch.testing.assert_close(short, padded)
    long = model.encode_queries(torch.tensor([[9, 9, 1, 2, 3, 4, 5, 6]]), torch.tensor([2]))
    torch.testing.assert_close(long, model.encode_queries(torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.tensor([2])))


def test_item_features_change_the_item_vector() -> None:
    model = small()
    base = model.item_embeddings()
    with torch.no_grad():
        model.content[3] += 1.0  # content
    assert not torch.allclose(model.item_embeddings()[3], base[3])
    torch.testing.assert_close(model.item_embeddings()[4], base[4])
    assert model.item_embeddings()[0].abs().sum() == 0  # the padding item has no vector


def test_a_content_first_item_tower_places_a_never_trained_item_by_its_content_alone() -> None:
    counts = torch.tensor([0.0, 5, 5, 0, 5, 5, 5, 5, 5, 5, 5, 5, 5])  # item 3 never trained
    model = small(content_first=True)
    model.counts.copy_(counts)
    base = model.item_embeddings()
    with torch.no_grad():  # every item's id embedding changes (a view of the fused table's rows)
        ids = model.item_features.table_weight("item_id")
        ids.add_(torch.randn_like(ids))
    moved = model.item_embeddings()
    torch.testing.assert_close(moved[3], base[3])  # its id feature counts 0 times
    assert not torch.allclose(moved[4], base[4])
    with pytest.raises(ValueError, match="content_first needs use_content or sid_levels"):
        TwoTowerConfig(num_items=3, content_first=True)


def test_the_lookup_backend_is_chosen_by_the_config() -> None:
    from recsys.ops.embedding_bag import Kernel

    model = TwoTower(TwoTowerConfig(num_items=5, max_history=4, dim=8, hidden_dim=16, embedding_kernel="torch"))
    assert model.item_features.kernel is Kernel.TORCH
    assert TwoTower(TwoTowerConfig(num_items=5, max_history=4, dim=8, hidden_dim=16)).item_features.kernel is None
    with pytest.raises(ValueError, match="sharded ones"):
        TwoTowerConfig(num_items=5, shard_tables="table_wise", embedding_kernel="torch")


def test_the_sequence_user_tower_reads_the_order_of_the_history() -> None:
    model = small(user_tower="sequence")  # a causal transformer over the item tower's vectors
    assert model.sequence is not None and model.user_features is not None  # the hashed user id stays a bag
    histories = torch.tensor([[0, 1, 2, 3], [0, 3, 2, 1]])
    users = model.encode_queries(histories)
    assert not torch.allclose(users[0], users[1]), "the same items in another order are another user"
    torch.testing.assert_close(users.norm(dim=1), torch.ones(2))
    pooled = small().encode_queries(histories)  # the default tower
    torch.testing.assert_close(pooled[0], pooled[1])  # the mean pools ignore the order (the 3 most recent: all)


def sequence_tower(num_items: int = 12) -> TwoTower:
    torch.manual_seed(0)
    config = TwoTowerConfig(num_items=num_items, max_history=6, dim=8, hidden_dim=16, user_tower="sequence",
                            use_content=True, content_dim=5, temperature=0.1)  # fmt: skip
    return TwoTower(config, content=torch.randn(num_items + 1, 5)).eval()


def test_packed_rows_give_each_position_the_user_vector_its_history_is_served() -> None:
    model = sequence_tower()  # objective next_item trains forward(); serving reads encode_queries: they must agree
    items = torch.tensor([[1, 2, 3, 4, 5, 0]])
    segments = torch.tensor([[1, 1, 1, 2, 2, 0]])
    positions = torch.tensor([[3, 4, 5, 4, 5, 0]])  # counted back from each run's most recent item (batching)
    states = model(items, segments, positions)
    served = model.encode_queries(torch.tensor([[1, 2, 3], [0, 4, 5]]))
    torch.testing.assert_close(states[0, [2, 4]] * 0.1, served)  # logits = user vector . item vector / temperature


def test_the_next_item_objective_trains_the_sequence_tower_as_sasrec_is_trained(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    pooled = TwoTower(TwoTowerConfig(num_items=data.num_items))
    with pytest.raises(ConfigError, match="user_tower: sequence"):
        recipe_for(pooled, data, 4, TwoTowerTraining(objective="next_item"))
    torch.manual_seed(0)
    config = TwoTowerConfig(num_items=data.num_items, max_history=20, dim=32, hidden_dim=64, dropout=0.0,
                            user_tower="sequence", temperature=0.1)  # fmt: skip
    model = TwoTower(config)
    recipe = recipe_for(model, data, 8, TwoTowerTraining(objective="next_item"))
    assert isinstance(recipe, NextItemRecipe) and recipe.sampling_probs is None  # full softmax on a small catalogue
    result = fit(model, data, quick_train(10, 8, 3e-3), EVAL, recipe)
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"])
    assert valid > 1.5 * popularity_valid_metric(data, EVAL) > 0


def test_loss_is_softmax_over_in_batch_and_random_items_with_logq_and_accidental_hits_masked() -> None:
    model = small()
    pool = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12])  # item 11 does not exist at training time (cold)
    recipe = TwoTowerRecipe(max_history=6, batch_size=3, target_log_probs=torch.log(torch.full((13,), 1 / 12)),
                            num_negatives=2, negative_pool=pool)  # fmt: skip
    batch = HistoryBatch(torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([7, 7, 8]), torch.tensor([1, 2, 3]))
    loss, n = recipe.loss(model, batch, torch.Generator().manual_seed(0))
    random = pool[torch.randint(0, len(pool), (2,), generator=torch.Generator().manual_seed(0))]
    candidates = torch.cat([batch.targets, random])
    logits = model.encode_queries(batch.histories, batch.users) @ model.encode_items(candidates).T / 0.05
    logits = logits - torch.tensor([math.log(3 / 12)] * 3 + [math.log(2 / len(pool))] * 2)
    logits[0, 1] = logits[1, 0] = float("-inf")  # rows 0 and 1 share target 7
    for row in range(3):
        for col in range(3, 5):
            if candidates[col] == batch.targets[row]:
                logits[row, col] = float("-inf")
    assert n == 3
    torch.testing.assert_close(loss, F.cross_entropy(logits, torch.arange(3)))


def test_random_negatives_are_drawn_only_from_items_that_exist_at_training_time(tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    prepare(load_source("synthetic", None, num_users=200, num_items=100), out, PrepareSettings(cold_start_fraction=0.2))
    data = load_prepared(out)
    model = TwoTower(TwoTowerConfig(num_items=data.num_items, max_history=20, dim=16, hidden_dim=32))
    recipe = recipe_for(model, data, 8, TwoTowerTraining(16))
    assert isinstance(recipe, TwoTowerRecipe)
    pool = set(recipe.negative_pool.tolist())
    cold = set(torch.nonzero(data.cold_mask).squeeze(1).tolist())
    assert cold and not pool & cold and pool | cold == set(range(1, data.num_items + 1))


def test_two_tower_beats_popularity_on_the_tiny_data(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    model = TwoTower(TwoTowerConfig(num_items=data.num_items, max_history=20, dim=32, hidden_dim=64, dropout=0.0))
    config = quick_train(10, 32, 3e-3)
    recipe = recipe_for(model, data, config.optimization.batch_size, TwoTowerTraining(32))
    result = fit(model, data, config, EVAL, recipe)
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"])
    baseline = popularity_valid_metric(data, EVAL)
    assert valid > 1.5 * baseline > 0


def test_saved_model_carries_its_codes_and_content(tmp_path: Path) -> None:
    model = small()
    save_model(tmp_path / "model.pt", model)
    name, loaded = load_model(tmp_path / "model.pt")
    history, users = torch.tensor([[1, 2, 3]]), torch.tensor([5])
    assert name == "two_tower"
    torch.testing.assert_close(loaded.score(history, users), model.score(history, users))


def test_a_model_saved_before_its_weights_were_renamed_says_to_train_again(tmp_path: Path) -> None:
    save_model(tmp_path / "model.pt", small())
    payload = load_checkpoint(tmp_path / "model.pt")
    state = payload["state_dict"]
    state["item_mlp.0.weight"] = state.pop("item_mlp.linear.weight")  # an earlier version's name of the layer
    save_checkpoint(tmp_path / "model.pt", payload)
    with pytest.raises(RecsysError, match=r"do not fit this version's two_tower model.*train the model again"):
        load_model(tmp_path / "model.pt")
