"""The run's optimizers: Adam for dense parameters, SparseAdam for row-sparse item tables, one schedule."""

from __future__ import annotations

import itertools

import pytest
import torch

from recsys.errors import ConfigError
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.capabilities import use_sparse_item_gradients
from recsys.training.losses import sampled_softmax_loss
from recsys.training.optimization import build_optimization
from recsys.training.recipes.next_item import NextItemRecipe


def _optimization(model: torch.nn.Module, **kwargs: object) -> object:
    settings = {"lr": 1e-2, "weight_decay": 0.0, "schedule": "constant", "warmup_steps": 0, "total_steps": 1,
                "fused": False, **kwargs}  # fmt: skip
    return build_optimization(model, **settings)  # type: ignore[arg-type]


def test_cosine_schedule_warms_up_then_decays_to_zero() -> None:
    layer = torch.nn.Linear(1, 1)
    optimization = build_optimization(
        layer, lr=1.0, weight_decay=0.0, schedule="cosine", warmup_steps=4, total_steps=20, fused=False
    )
    lrs = []
    for _ in range(20):
        lrs.append(optimization.optimizers[0].param_groups[0]["lr"])
        optimization.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:])) and lrs[-1] < 0.01


def _sampled_step(model: SASRec, recipe: NextItemRecipe, optimization: object, items: torch.Tensor) -> None:
    hidden = model(items[None], (items[None] != 0).long(), torch.arange(items.numel())[None])[0]
    negatives = torch.tensor([1, 2])
    vectors = model.item_rows(torch.cat([items, negatives]))
    loss = sampled_softmax_loss(hidden, vectors[: items.numel()], vectors[items.numel() :], items, negatives,
                                recipe.sampling_probs)  # type: ignore[arg-type]  # fmt: skip
    optimization.zero_grad()  # type: ignore[attr-defined]
    loss.backward()
    optimization.step()  # type: ignore[attr-defined]


def _tiny_sasrec(sparse: bool) -> SASRec:
    """A one-layer SASRec over 20 items without dropout; `sparse`: its item table with row-sparse gradients."""
    torch.manual_seed(0)
    config = SASRecConfig(num_items=20, max_history=4, dim=8, num_heads=1, ffn_dim=16, num_layers=1, dropout=0,
                          attn_dropout=0)  # fmt: skip
    model = SASRec(config)
    if sparse:
        use_sparse_item_gradients(model)
    return model


@pytest.mark.parametrize("sparse", [False, True])
def test_a_sparse_item_table_moves_only_the_rows_a_step_read(sparse: bool) -> None:
    model = _tiny_sasrec(sparse)
    optimization = _optimization(model)
    assert [type(o).__name__ for o in optimization.optimizers] == (["Adam", "SparseAdam"] if sparse else ["Adam"])  # type: ignore[attr-defined]
    recipe = NextItemRecipe(max_history=4, rows_per_batch=1, sampling_probs=torch.full((21,), 1 / 20))
    _sampled_step(model, recipe, optimization, torch.tensor([3, 4, 5]))  # reads rows 1-5
    before = model.item_emb.weight.detach().clone()  # type: ignore[union-attr]
    _sampled_step(model, recipe, optimization, torch.tensor([6, 7, 8]))  # reads rows 1, 2, 6-8
    moved = (model.item_emb.weight.detach() != before).any(1).nonzero().flatten().tolist()  # type: ignore[union-attr]
    # dense Adam keeps moving rows 3-5 by their momentum; SparseAdam touches what this step read only
    assert moved == ([1, 2, 6, 7, 8] if sparse else [1, 2, 3, 4, 5, 6, 7, 8])


def test_weight_decay_is_refused_with_a_sparse_table() -> None:
    model = SASRec(SASRecConfig(num_items=20, max_history=4, dim=8, num_heads=1, ffn_dim=16, num_layers=1))
    use_sparse_item_gradients(model)
    with pytest.raises(ConfigError, match=r"train\.optimization\.weight_decay"):
        _optimization(model, weight_decay=0.1)


@pytest.mark.parametrize("sparse", [False, True])
def test_max_grad_norm_bounds_the_dense_gradients_and_leaves_a_sparse_table_as_it_is(sparse: bool) -> None:
    model = _tiny_sasrec(sparse)
    optimization = _optimization(model, max_grad_norm=0.5)
    recipe = NextItemRecipe(max_history=4, rows_per_batch=1, sampling_probs=torch.full((21,), 1 / 20))
    table = model.item_emb.weight  # type: ignore[union-attr]
    dense = [p for p in model.parameters() if p is not table or not sparse]

    def grad_norm(params: list[torch.nn.Parameter]) -> float:
        return float(torch.linalg.vector_norm(torch.stack([p.grad.to_dense().norm() for p in params])))  # type: ignore[union-attr]

    hidden = model(torch.tensor([[3, 4, 5]]), torch.ones(1, 3, dtype=torch.long), torch.arange(3)[None])[0]
    vectors = model.item_rows(torch.tensor([3, 4, 5, 1, 2]))
    loss = 1e3 * sampled_softmax_loss(hidden, vectors[:3], vectors[3:], torch.tensor([3, 4, 5]),
                                      torch.tensor([1, 2]), recipe.sampling_probs)  # fmt: skip
    optimization.zero_grad()  # type: ignore[attr-defined]
    loss.backward()
    assert grad_norm(dense) > 0.5
    table_grad = table.grad.to_dense().clone()  # type: ignore[union-attr]
    optimization.step()  # type: ignore[attr-defined]
    assert grad_norm(dense) == pytest.approx(0.5, rel=1e-4)
    if sparse:
        torch.testing.assert_close(table.grad.to_dense(), table_grad)  # type: ignore[union-attr]
