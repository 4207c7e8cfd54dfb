"""SASRec and HSTU: causal, padding-invariant, packed rows equal separate histories; the losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.data.batching import PackedBatch
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.losses import full_softmax_loss, sampled_softmax_loss
from recsys.training.recipes import NextItemRecipe


@pytest.fixture(params=["sasrec", "hstu"])
def model(request: pytest.FixtureRequest) -> SASRec | HSTU:
    """Both packed-row sequential retrievers share these layout properties."""
    torch.manual_seed(0)
    if request.param == "sasrec":
        return SASRec(SASRecConfig(num_items=20, max_len=6, dim=16, num_heads=2, ffn_dim=32)).eval()
    hstu = HSTU(HSTUConfig(num_items=20, max_len=6, dim=16, num_heads=2)).eval()
    with torch.no_grad():
        for layer in hstu.layers:
            layer.position_bias.normal_()  # zero at initialisation: make the relative bias matter here
    return hstu


def test_outputs_are_causal(model: SASRec | HSTU) -> None:
    a = model(torch.tensor([[0, 3, 4, 5, 6, 7]]))
    b = model(torch.tensor([[0, 3, 4, 5, 9, 1]]))  # only the last two items differ
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_extra_left_padding_does_not_change_the_user_vector(model: SASRec | HSTU) -> None:
    short = model.encode_queries(torch.tensor([[3, 4, 5]]))
    padded = model.encode_queries(torch.tensor([[0, 0, 0, 3, 4, 5]]))
    torch.testing.assert_close(short, padded)


def test_histories_longer_than_max_len_keep_the_most_recent_items(model: SASRec | HSTU) -> None:
    long = model.score(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]))
    recent = model.score(torch.tensor([[3, 4, 5, 6, 7, 8]]))
    torch.testing.assert_close(long, recent)
    assert long.shape == (1, 21)


def test_packed_rows_match_separate_left_padded_histories(model: SASRec | HSTU) -> None:
    packed = model(
        torch.tensor([[3, 4, 5, 7, 8, 0]]),
        segments=torch.tensor([[1, 1, 1, 2, 2, 0]]),
        positions=torch.tensor([[3, 4, 5, 4, 5, 0]]),
    )
    torch.testing.assert_close(packed[0, 2], model.encode_queries(torch.tensor([[3, 4, 5]]))[0])
    torch.testing.assert_close(packed[0, 4], model.encode_queries(torch.tensor([[7, 8]]))[0])
    torch.testing.assert_close(packed[0, 3], model(torch.tensor([[7, 8]]))[0, 0])


def test_full_softmax_loss_is_cross_entropy_without_the_padding_row() -> None:
    torch.manual_seed(0)
    hidden, emb, targets = torch.randn(5, 8), torch.randn(11, 8), torch.tensor([1, 4, 10, 2, 2])
    expected = F.cross_entropy(hidden @ emb[1:].T, targets - 1)
    torch.testing.assert_close(full_softmax_loss(hidden, emb, targets), expected)


def test_within_domain_softmax_is_cross_entropy_over_the_targets_domain() -> None:
    torch.manual_seed(0)
    model = SASRec(SASRecConfig(num_items=6, max_len=4, dim=8, num_heads=1, ffn_dim=16)).eval()
    item_domains = torch.tensor([-1, 0, 0, 0, 1, 1, 1])  # items 1-3 in domain 0, 4-6 in domain 1
    recipe = NextItemRecipe(max_len=4, rows_per_batch=1, item_domains=item_domains)
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


def test_sampled_softmax_with_uniform_q_matches_the_manual_formula() -> None:
    torch.manual_seed(0)
    hidden, emb, targets = torch.randn(4, 8), torch.randn(6, 8), torch.tensor([1, 2, 3, 5])
    probs = torch.tensor([0.0, 0.2, 0.2, 0.2, 0.2, 0.2])
    gen = torch.Generator().manual_seed(1)
    loss = sampled_softmax_loss(hidden, emb, targets, probs, num_negatives=3, generator=gen)
    negatives = torch.multinomial(probs, 3, replacement=True, generator=torch.Generator().manual_seed(1))
    log_q = torch.log(torch.tensor(0.2 * 3))
    pos = (hidden * emb[targets]).sum(-1, keepdim=True) - log_q
    neg = (hidden @ emb[negatives].T - log_q).masked_fill(negatives[None] == targets[:, None], float("-inf"))
    expected = F.cross_entropy(torch.cat([pos, neg], 1), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(loss, expected)
