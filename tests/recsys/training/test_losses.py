"""Next-item losses: full softmax without the padding row, sampled softmax with logQ correction."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.training.losses import NegativeSampler, full_softmax_loss, sampled_softmax_loss


def test_full_softmax_loss_is_cross_entropy_without_the_padding_row() -> None:
    torch.manual_seed(0)
    hidden, emb, targets = torch.randn(5, 8), torch.randn(11, 8), torch.tensor([1, 4, 10, 2, 2])
    expected = F.cross_entropy(hidden @ emb[1:].T, targets - 1)
    torch.testing.assert_close(full_softmax_loss(hidden, emb, targets), expected)


def test_sampled_softmax_with_uniform_q_matches_the_manual_formula() -> None:
    torch.manual_seed(0)
    hidden, emb, targets = torch.randn(4, 8), torch.randn(6, 8), torch.tensor([1, 2, 3, 5])
    probs = torch.tensor([0.0, 0.2, 0.2, 0.2, 0.2, 0.2])
    negatives = NegativeSampler(probs).draw(3, torch.Generator().manual_seed(1), torch.device("cpu"))
    loss = sampled_softmax_loss(hidden, emb[targets], emb[negatives], targets, negatives, probs)
    log_q = torch.log(torch.tensor(0.2 * 3))
    pos = (hidden * emb[targets]).sum(-1, keepdim=True) - log_q
    neg = (hidden @ emb[negatives].T - log_q).masked_fill(negatives[None] == targets[:, None], float("-inf"))
    expected = F.cross_entropy(torch.cat([pos, neg], 1), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(loss, expected)


def test_per_target_biases_are_added_to_every_items_logit_in_both_losses() -> None:
    """A query-aware model's lexical scores: one (V+1) row of logits per target, the padding column unused."""
    torch.manual_seed(0)
    hidden, emb, targets = torch.randn(4, 8), torch.randn(6, 8), torch.tensor([1, 2, 3, 5])
    biases = torch.randn(4, 6)
    expected = F.cross_entropy(hidden @ emb[1:].T + biases[:, 1:], targets - 1)
    torch.testing.assert_close(full_softmax_loss(hidden, emb, targets, biases=biases), expected)

    probs, negatives = torch.tensor([0.0, 0.2, 0.2, 0.2, 0.2, 0.2]), torch.tensor([2, 4, 5])
    loss = sampled_softmax_loss(hidden, emb[targets], emb[negatives], targets, negatives, probs, biases)
    log_q = torch.log(torch.tensor(0.2 * 3))
    pos = (hidden * emb[targets]).sum(-1, keepdim=True) - log_q + biases.gather(1, targets[:, None])
    neg = hidden @ emb[negatives].T - log_q + biases[:, negatives]
    neg = neg.masked_fill(negatives[None] == targets[:, None], float("-inf"))
    expected = F.cross_entropy(torch.cat([pos, neg], 1), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(loss, expected)
    unbiased = sampled_softmax_loss(hidden, emb[targets], emb[negatives], targets, negatives, probs)
    assert not torch.allclose(loss, unbiased)


def test_the_negative_sampler_draws_by_the_distribution_and_never_an_item_without_mass() -> None:
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])  # the padding, item 2 and the last item cannot be drawn
    sampler = NegativeSampler(probs * 7)  # unnormalised: the same distribution
    drawn = sampler.draw(200_000, torch.Generator().manual_seed(0), torch.device("cpu"))
    shares = torch.bincount(drawn, minlength=6).double() / drawn.numel()
    torch.testing.assert_close(shares, probs.double(), atol=0.005, rtol=0)
    again = sampler.draw(200_000, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert torch.equal(drawn, again)  # the run's seeded generator decides the draws


def test_the_negative_sampler_refuses_what_is_no_distribution() -> None:
    for bad in (torch.zeros(4), torch.tensor([0.0, -0.1, 1.0]), torch.tensor([0.0, float("nan")]), torch.ones(2, 2)):
        with pytest.raises(ValueError, match="sampling probabilities"):
            NegativeSampler(bad)
