"""Training recipes: what each model family computes from a batch."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
import torch.nn.functional as F

from recsys.data.batching import PackedBatch
from recsys.models.registry import family_names, model_family
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.recipes import NextItemRecipe
from recsys.training.recipes.next_item import NextItemModel
from recsys.training.recipes.pairs import GenerativeModel, TwoTowerModel
from recsys.training.recipes.queries import QueryModel
from recsys.training.recipes.ranker import RankerModel


def test_within_domain_softmax_is_cross_entropy_over_the_targets_domain() -> None:
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=6, max_history=4, dim=8, num_heads=1, ffn_dim=16)).eval()
    item_domains = torch.tensor([-1, 0, 0, 0, 1, 1, 1])  # items 1-3 in domain 0, 4-6 in domain 1
    recipe = NextItemRecipe(max_history=4, rows_per_batch=1, item_domains=item_domains)
    inputs, targets = torch.tensor([[1, 2, 4, 5]]), torch.tensor([[2, 3, 5, 6]])
    batch = PackedBatch(inputs, targets, torch.tensor([[1, 1, 2, 2]]), torch.tensor([[2, 3, 2, 3]]))
    loss, n = recipe.loss(model, batch, torch.Generator())
    logits = model(batch.inputs, batch.segments, batch.positions)[0] @ model.item_embeddings()[1:].T  # (4, 6)
    expected = torch.stack(
        [
            F.cross_entropy(logits[i, lo : lo + 3], torch.tensor(t - 1 - lo))
            for i, (t, lo) in enumerate(zip([2, 3, 5, 6], [0, 0, 3, 3], strict=True))
        ]
    ).mean()
    assert n == 4
    torch.testing.assert_close(loss, expected)


TRAINED_AS = {"next_item": NextItemModel, "queries": QueryModel, "generative": GenerativeModel,
              "two_tower": TwoTowerModel, "ranker": RankerModel}  # fmt: skip
INSTANCE_ATTRIBUTES = {"config"}  # plain attributes every model sets in __init__ (Model.config)


@pytest.mark.parametrize("name", [name for name in family_names() if model_family(name).training in TRAINED_AS])
def test_each_family_meets_its_recipes_protocol_when_read_statically(name: str) -> None:
    """On Python >= 3.12 an isinstance check of a runtime protocol reads the model's attributes with
    inspect.getattr_static, which does not see a module's buffers, parameters or submodules: a protocol member must
    be a method or property of the model's class."""
    family = model_family(name)
    protocol = TRAINED_AS[family.training]
    missing = []
    for member in sorted(typing._get_protocol_attrs(protocol)):  # type: ignore[attr-defined]
        try:
            inspect.getattr_static(family.model, member)
        except AttributeError:
            if member not in INSTANCE_ATTRIBUTES:
                missing.append(member)
    assert not missing, f"{family.model.__name__} lacks {missing} of {protocol.__name__} as class members"
