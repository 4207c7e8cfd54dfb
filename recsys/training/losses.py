"""Losses: the next item over the item catalog, a teacher's distribution over its candidates (distillation), and
the ranker's tasks (ranking its candidates, the labels of `recsys.data.tasks`).

Dimension letters: N real (non-padded) positions or examples, D dim, V+1 items (row 0 = padding), S negatives,
C candidates, K a teacher's candidates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recsys.data.tasks import TaskKind


def full_softmax_loss(
    hidden: torch.Tensor,
    item_emb: torch.Tensor,
    targets: torch.Tensor,
    excluded: torch.Tensor | None = None,
    biases: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy over every item.

    Args:
        hidden: (N, D) hidden states at real positions.
        item_emb: (V+1, D) item vectors; the padding row is excluded from the softmax.
        targets: (N,) item_idx >= 1.
        excluded: (V+1,) bool, items left out of the softmax (cold-start items, which do not exist yet
            at training time: as negatives they would be trained to score low); or (N, V+1), per target.
        biases: (N, V+1) logits added to the dot products (a query-aware model's lexical scores), or None.
    """
    logits = (hidden @ item_emb[1:].T).float()  # (N, V)
    if biases is not None:
        logits = logits + biases[:, 1:].float()
    if excluded is not None:
        logits = logits.masked_fill(excluded[..., 1:], float("-inf"))
    return F.cross_entropy(logits, targets - 1)


class NegativeSampler:
    """Item_idx drawn with replacement from a fixed distribution over the catalogue, by inverse CDF on the device that
    trains: the host draws S uniforms from the run's seeded generator (the same draws whatever the device) and the
    device finds them in the distribution's cumulative sums, copied to it once. (torch.multinomial on the host rebuilds
    those sums every call, O(V): milliseconds a step at 10^6 items, and its draws then travel to the device.)

    Args:
        probs: (V+1,) the distribution, >= 0 with a positive sum (it need not sum to 1); 0 at the padding index.

    Example:
        >>> sampler = NegativeSampler(torch.tensor([0.0, 0.5, 0.0, 0.5]))
        >>> sorted(set(sampler.draw(100, torch.Generator().manual_seed(0), torch.device("cpu")).tolist()))
        [1, 3]
    """

    def __init__(self, probs: torch.Tensor) -> None:
        if probs.ndim != 1 or not bool(torch.isfinite(probs).all() & (probs >= 0).all()) or float(probs.sum()) <= 0:
            raise ValueError("sampling probabilities must be a 1-d tensor of finite values >= 0 with a positive sum, "
                             f"got shape {tuple(probs.shape)}")  # fmt: skip
        self.probs = probs
        self._cdf = probs.double().cumsum(0)  # float64: 10^6 float32 sums would blur the rarest items' intervals
        # the last item that can be drawn: a uniform rounded up to the total must not land past it
        self._last = int(torch.nonzero(probs).max())
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(the probabilities, their cumulative sums) on `device`, copied there once."""
        if device not in self._on_device:
            self._on_device[device] = (self.probs.to(device), self._cdf.to(device))
        return self._on_device[device]

    def draw(self, num: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
        """(num,) item_idx on `device`, shared by every row of a batch."""
        _, cdf = self.on(device)
        uniforms = torch.rand(num, generator=generator, dtype=torch.float64) * float(self._cdf[-1])
        if device.type == "cuda":  # from pinned memory the copy is queued; from pageable memory the host would wait
            uniforms = uniforms.pin_memory()
        uniforms = uniforms.to(device, non_blocking=True)
        return torch.searchsorted(cdf, uniforms, right=True).clamp_(max=self._last)


def sampled_softmax_loss(
    hidden: torch.Tensor,
    target_vectors: torch.Tensor,
    negative_vectors: torch.Tensor,
    targets: torch.Tensor,
    negatives: torch.Tensor,
    sampling_probs: torch.Tensor,
    biases: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax over the target and S shared negatives, with logQ correction.

    The negatives are drawn by `sampling_probs` (`NegativeSampler`) and, for mixed negatives, include the batch's
    targets, which the data draws by its own popularity (what `sampling_probs` estimates). Subtracting the log of each
    item's expected count among the S negatives, log(S * q), from every logit makes the sampled softmax an
    unbiased-in-the-limit estimate of the full one (Bengio & Senecal 2008; Yi et al. 2019). A negative equal to the
    row's target (its own in-batch copy included) is masked out. The item vectors come in as rows (not the whole
    table), so a table with row-sparse gradients is touched only where a step reads it.

    Args:
        hidden: (N, D); target_vectors: (N, D) and negative_vectors: (S, D), the output vectors of
        targets: (N,) item_idx >= 1 and negatives: (S,) item_idx.
        sampling_probs: (V+1,) the distribution the negatives were drawn from, 0 at the padding index (kept on
            hidden's device by the caller: `NegativeSampler.on`).
        biases: (N, V+1) logits added to the dot products (a query-aware model's lexical scores), or None.
    """
    probs, scale = sampling_probs.to(hidden.device), negatives.numel()  # a no-op for probabilities kept there
    pos_logits = (hidden * target_vectors).sum(-1, keepdim=True) - torch.log(probs[targets] * scale)[:, None]  # (N, 1)
    neg_logits = hidden @ negative_vectors.T - torch.log(probs[negatives] * scale)[None, :]  # (N, S)
    if biases is not None:
        pos_logits = pos_logits + biases.gather(1, targets[:, None]).to(pos_logits)
        neg_logits = neg_logits + biases[:, negatives].to(neg_logits)
    neg_logits = neg_logits.masked_fill(negatives[None, :] == targets[:, None], float("-inf"))
    logits = torch.cat([pos_logits, neg_logits], dim=1).float()
    return F.cross_entropy(logits, torch.zeros_like(targets))


def distillation_kl(
    student_logits: torch.Tensor, teacher_scores: torch.Tensor, valid: torch.Tensor, temperature: float
) -> torch.Tensor:
    """T^2 * KL(p || q), averaged over rows: p = softmax(teacher_scores / T) and q = softmax(student_logits / T), both
    over each row's valid candidates (Hinton et al. 2015; the T^2 keeps the gradient's scale as T changes).

    Args:
        student_logits: (N, K) the student's logits of each row's candidates.
        teacher_scores: (N, K) the teacher's scores of them.
        valid: (N, K) bool, the real candidates (a teacher may score fewer than K items); every row has one.
        temperature: T > 0.

    Example:
        >>> scores = torch.tensor([[2.0, 1.0, 0.0]])
        >>> float(distillation_kl(scores, scores, torch.ones(1, 3, dtype=torch.bool), 2.0))
        0.0
    """
    hidden = float("-inf")
    log_p = F.log_softmax((teacher_scores.float() / temperature).masked_fill(~valid, hidden), dim=-1)  # (N, K)
    log_q = F.log_softmax((student_logits.float() / temperature).masked_fill(~valid, hidden), dim=-1)  # (N, K)
    # invalid candidates have p = 0 and add nothing (where, not p * (log p - log q): that is 0 * nan there)
    terms = torch.where(valid, log_p.exp() * (log_p - log_q), 0.0)
    return terms.sum(-1).mean() * temperature**2


def candidate_softmax_loss(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each row's positive among its candidates.

    Args:
        logits: (N, C) the candidates' scores.
        positives: (N,) the column of each row's positive.
    """
    return F.cross_entropy(logits.float(), positives)


def task_loss(kind: TaskKind, predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean loss of one task over the labelled examples (a NaN label is unknown: it counts for nothing).

    Args:
        kind: "binary" (binary cross-entropy on logits) or "regression" (squared error).
        predictions: (N,) logits (binary) or values (regression).
        labels: (N,) 0/1 (binary) or targets (regression), NaN where unknown.
    """
    known = ~labels.isnan()
    if not bool(known.any()):
        return predictions.sum() * 0.0  # keeps the graph: no label, no gradient
    predictions, labels = predictions[known].float(), labels[known]
    if kind == "binary":
        return F.binary_cross_entropy_with_logits(predictions, labels)
    return F.mse_loss(predictions, labels)
