"""A prior for new items: how much a logit offset for items the model never trained on lifts them, chosen on validation.

A retriever trained on the catalogue's interactions ranks an item it never saw as a target below the trained ones even
when its vector comes from its text (`recsys.modules.content_items`): every trained item's vector was fitted to be
scored high for its own users, the new item's was not. Adding `prior` to the logit of every never-trained item
multiplies its softmax probability by exp(prior), the correction a shift in the item prior asks for (as logQ corrects
a sampled softmax). The offset is one number: it is chosen on the validation split, where new items' users exist, and
never on test.

    ranks = ranks_with_priors(model, split, new_items, priors)   # (P, U) every user's target rank per offset
    prior = chosen_prior(priors, warm_ndcg, tolerance=0.02)      # the largest offset costing <= 2 % of warm N@10
    prior = chosen_prior(priors, warm_ndcg, 0.02, baseline=b)    # ... keeping warm N@10 >= 98 % of another model's b

Dimension letters: B users in a batch, U users of the split, P offsets, V+1 items (0 = padding).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from recsys.data.prepared import EvalSplit
from recsys.evaluation.metrics import target_ranks
from recsys.evaluation.protocol import EvalConfig, history_batches
from recsys.inference import Scorer, mask_unrankable

logger = logging.getLogger(__name__)


@torch.no_grad()
def ranks_with_priors(
    scorer: Scorer,
    split: EvalSplit,
    new_items: torch.Tensor,
    priors: Sequence[float],
    config: EvalConfig | None = None,
) -> torch.Tensor:
    """Every user's target rank (the protocol's: all items ranked, `target_ranks`' ties) when `prior` is added to the
    scores of `new_items`, for each prior; the model scores each user batch once.

    Args:
        scorer: any model (`recsys.inference.Scorer`).
        split: the users and targets (`SequenceData.eval_split`).
        new_items: (V+1,) bool, the items the offset applies to (e.g. those with no training interactions).
        priors: the P offsets, in logit units; 0 gives the protocol's own ranks.
        config: batching and `exclude_seen` (the ks play no part).

    Returns:
        (P, U) int64 ranks, rows in the order of `priors`, columns in the split's user order.
    """
    config = config or EvalConfig()
    if new_items.dtype != torch.bool or new_items.ndim != 1:
        raise ValueError(f"new_items must be a (V+1,) bool mask, got {new_items.dtype} {tuple(new_items.shape)}")
    if bool(new_items[0]):
        raise ValueError("new_items marks the padding (item 0). Fix: leave index 0 False")
    ranks = torch.empty(len(priors), len(split.targets), dtype=torch.int64)
    offsets = torch.tensor(list(priors), dtype=torch.float32)[:, None] * new_items.float()[None, :]  # (P, V+1)
    for rows, histories, width in history_batches(split, scorer.max_history, config.batch_size):
        scores = scorer.score(histories.to_padded(width), split.user_idx[rows], split.times(rows, width)).float()
        scores = mask_unrankable(scores, histories if config.exclude_seen else None, candidates=split.candidates)
        offsets = offsets.to(scores.device)  # moved once: later batches find it there
        targets = split.targets[rows].to(scores.device)
        for p in range(len(priors)):
            ranks[p, rows] = target_ranks(scores + offsets[p], targets).cpu()
    return ranks


def chosen_prior(
    priors: Sequence[float], warm_ndcg: Sequence[float], tolerance: float, baseline: float | None = None
) -> float:
    """The largest offset whose validation N@10 on warm users (those whose target was trained on) stays within
    `tolerance` of `baseline` (default: the no-offset one's): the most lift for new items the warm users pay at most
    that share for. A baseline of another model (e.g. the ranker this one replaces) lets a model better on warm users
    spend its margin on new items; where no offset keeps to it, 0 (the model's own scores).

    Args:
        priors: the offsets tried, 0 among them.
        warm_ndcg: each one's warm-user validation N@10, in the same order.
        tolerance: the share of warm N@10 one may lose, in [0, 1).
        baseline: the warm validation N@10 the tolerance is a share of; None = the offset 0's.

    Example:
        >>> chosen_prior([0.0, 1.0, 2.0, 3.0], [0.050, 0.0495, 0.0491, 0.040], tolerance=0.02)
        2.0
        >>> chosen_prior([0.0, 1.0, 2.0, 3.0], [0.050, 0.0495, 0.0491, 0.040], tolerance=0.02, baseline=0.045)
        2.0
        >>> chosen_prior([0.0, 1.0, 2.0, 3.0], [0.050, 0.0495, 0.0491, 0.040], tolerance=0.02, baseline=0.040)
        3.0
    """
    if len(priors) != len(warm_ndcg) or 0.0 not in priors:
        raise ValueError("chosen_prior needs one warm N@10 per offset and the offset 0 among them (the reference)")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance is a share of warm N@10 in [0, 1), got {tolerance}")
    if baseline is not None and not baseline >= 0.0:
        raise ValueError(f"baseline is a warm validation N@10, >= 0; got {baseline}")
    floor = (1.0 - tolerance) * (warm_ndcg[list(priors).index(0.0)] if baseline is None else baseline)
    return max((prior for prior, ndcg in zip(priors, warm_ndcg, strict=True) if ndcg >= floor), default=0.0)
