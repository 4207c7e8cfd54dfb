"""FusedEmbeddingBagCollection against torchrec's EmbeddingBagCollection: same outputs, same gradients."""

from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.modules.embedding_configs import PoolingType

from recsys.modules.embedding_bag_collection import FusedEmbeddingBagCollection
from recsys.ops.embedding_bag import Kernel

KERNELS = [Kernel.TORCH, Kernel.TRITON]


def tables(pooling: PoolingType = PoolingType.SUM) -> list[EmbeddingBagConfig]:
    """Two dims, so the module makes two groups (two launches); 'user' and 'item' share a group."""
    return [
        EmbeddingBagConfig(name="t_user", embedding_dim=8, num_embeddings=11, feature_names=["user"], pooling=pooling),
        EmbeddingBagConfig(name="t_cat", embedding_dim=4, num_embeddings=5, feature_names=["cat"], pooling=pooling),
        EmbeddingBagConfig(name="t_item", embedding_dim=8, num_embeddings=17, feature_names=["item"], pooling=pooling),
    ]


def batch(weighted: bool, keys: list[str]) -> KeyedJaggedTensor:
    """B=3 per feature, with an empty bag and duplicate ids, keys in the given order."""
    lists = {"user": [[1], [4, 4], []], "cat": [[0, 3], [], [2, 2, 1]], "item": [[16, 2, 5], [0], [9, 9]]}
    values = torch.tensor([i for key in keys for bag in lists[key] for i in bag])
    lengths = torch.tensor([len(bag) for key in keys for bag in lists[key]])
    weights = torch.linspace(0.5, 2.0, len(values)) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


# torchrec's EmbeddingBagCollection refuses per-sample weights with mean pooling: no such case to compare
POOLING_WEIGHTED = [(PoolingType.SUM, False), (PoolingType.SUM, True), (PoolingType.MEAN, False)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("pooling", "weighted"), POOLING_WEIGHTED)
@pytest.mark.parametrize("keys", [["user", "cat", "item"], ["item", "user", "cat"]])
def test_matches_torchrec(kernel: Kernel, weighted: bool, pooling: PoolingType, keys: list[str]) -> None:
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=tables(pooling), is_weighted=weighted)
    fused = FusedEmbeddingBagCollection.from_torchrec(reference, kernel=kernel)
    kjt = batch(weighted, keys)

    expected, actual = reference(kjt), fused(kjt)
    assert actual.keys() == expected.keys() == ["user", "cat", "item"]
    assert actual.length_per_key() == expected.length_per_key()
    torch.testing.assert_close(actual.values(), expected.values())

    upstream = torch.randn_like(expected.values())
    (expected.values() * upstream).sum().backward()
    (actual.values() * upstream).sum().backward()
    for group, flat in zip(fused.groups, fused.weights, strict=True):
        # a group's flat buffer holds its tables back to back, in config order
        expected_grad = torch.cat([reference.embedding_bags[t.name].weight.grad for t in group.tables])
        assert flat.grad is not None
        torch.testing.assert_close(flat.grad, expected_grad)


def test_two_dims_make_two_launch_groups_and_share_one_buffer_per_group() -> None:
    fused = FusedEmbeddingBagCollection(tables())
    assert [(g.dim, g.features) for g in fused.groups] == [(8, ["user", "item"]), (4, ["cat"])]
    assert [tuple(w.shape) for w in fused.weights] == [(28, 8), (5, 4)]
    bound = (1 / 11) ** 0.5  # torchrec's default init: uniform in +-sqrt(1 / num_embeddings)
    assert fused.table_weight("t_user").abs().max() <= bound


def test_sparse_gradients_hold_only_the_touched_rows() -> None:
    fused = FusedEmbeddingBagCollection(tables(), kernel=Kernel.TORCH, sparse_grad=True)
    fused(batch(False, ["user", "cat", "item"])).values().sum().backward()
    grad = fused.weights[0].grad
    assert grad is not None and grad.is_sparse
    touched = sorted({1, 4} | {11 + i for i in (16, 2, 5, 0, 9)})  # item rows start after the 11 user rows
    assert grad.coalesce().indices()[0].tolist() == touched


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=3, feature_names=["a", "b"]), "one feature"),
        (
            EmbeddingBagConfig(
                name="t", embedding_dim=4, num_embeddings=3, feature_names=["a"], pooling=PoolingType.NONE
            ),
            "SUM or MEAN",
        ),
    ],
)
def test_unsupported_tables_are_refused_with_a_fix(table: EmbeddingBagConfig, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FusedEmbeddingBagCollection([table])


def test_missing_features_are_named() -> None:
    fused = FusedEmbeddingBagCollection(tables())
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["user"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(KeyError, match=r"lacks features \['cat', 'item'\]"):
        fused(kjt)
