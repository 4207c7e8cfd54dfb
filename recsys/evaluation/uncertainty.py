"""How sure a metric is: per-user metrics, percentile-bootstrap intervals over users, and the paired test of two
models evaluated on the same users (docs/training.md, "Uncertainty").

A ranking metric is a mean over users of a per-user value (recall@k is a hit, NDCG@k a discounted hit, MRR a
reciprocal rank), so its uncertainty is that of a mean over the sampled users:

- `bootstrap_intervals`: resample the U users R times with replacement, take each metric's mean in every
  resample, and report the (1 - confidence) / 2 and (1 + confidence) / 2 percentiles of the R means.
- `paired_difference`: for two models on the same users, the difference of their means (a minus b); its interval
  is the bootstrap of the per-user differences (the same resampled users for both models, which removes the
  between-user variance both share), and its p-value that of a two-sided paired randomisation test: under "no
  difference" each user's difference is as likely negated, so its sign is flipped at random R times, and
  p = (1 + #{|resampled mean| >= |observed mean|}) / (1 + R).

Both are vectorised: a chunk of resamples is a (R, U) matrix of how often each user is drawn (one `randint` and
one `scatter_add_`) or of signs, and the chunk's R means of the M metrics are one (R, U) x (U, M) matmul.
Seeded: the same values and `Uncertainty` give the same intervals and p-values.

Dimension letters: U users, M metrics, R resamples (C of them in a chunk).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field, NonNegativeInt

from recsys.errors import ConfigError

CHUNK_ELEMENTS = 8_000_000  # a chunk's (C, U) float64 matrix: at most ~64 MB whatever U
Weights = Callable[[int, int, torch.Generator], torch.Tensor]  # (U, C, generator) -> (C, U) resampling weights


@dataclass(frozen=True)
class Uncertainty:
    """How intervals and p-values are computed (`EvalConfig.uncertainty`, configs: `eval.uncertainty.*`)."""

    resamples: NonNegativeInt = 1000  # bootstrap resamples and sign flips; 0 = no intervals
    confidence: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95  # of every interval
    seed: int = 0  # of the resampling: the same seed, the same intervals

    def to_dict(self) -> dict[str, object]:
        """What a report records of how its intervals were made."""
        return {"method": "percentile bootstrap over users", "resamples": self.resamples,
                "confidence": self.confidence, "seed": self.seed}  # fmt: skip


@dataclass(frozen=True)
class PairedDifference:
    """Model a minus model b on one metric over the same `users`: the difference of means, its interval, p-value."""

    metric: str
    difference: float
    low: float
    high: float
    p_value: float
    users: int

    def to_dict(self) -> dict[str, float]:
        return {"difference": self.difference, "low": self.low, "high": self.high, "p_value": self.p_value}


def per_user_metrics(ranks: torch.Tensor, ks: Sequence[int]) -> tuple[list[str], torch.Tensor]:
    """Each user's recall@k and ndcg@k for every k, and reciprocal rank: the values ranking metrics average.

    Args:
        ranks: (U,) 0-based rank of each user's target (`recsys.evaluation.metrics.target_ranks`).
        ks: the cut-offs.

    Returns:
        The metric names and a (U, M) float64 tensor of their values, columns in the names' order.

    Example:
        >>> names, values = per_user_metrics(torch.tensor([0, 3]), ks=(1,))
        >>> names, values.tolist()
        (['recall@1', 'ndcg@1', 'mrr'], [[1.0, 1.0, 1.0], [0.0, 0.0, 0.25]])
    """
    ranks = ranks.double()
    names: list[str] = []
    columns: list[torch.Tensor] = []
    for k in ks:
        hit = ranks < k
        names += [f"recall@{k}", f"ndcg@{k}"]
        columns += [hit.double(), torch.where(hit, 1.0 / torch.log2(ranks + 2.0), 0.0)]
    names.append("mrr")
    columns.append(1.0 / (ranks + 1.0))
    return names, torch.stack(columns, dim=1)  # (U, M)


def bootstrap_intervals(values: torch.Tensor, uncertainty: Uncertainty) -> torch.Tensor:
    """Percentile-bootstrap interval of the mean of every column of `values`, resampling its rows (users).

    Args:
        values: (U, M) per-user values (`per_user_metrics`), U >= 1.
        uncertainty: resamples (> 0), confidence and seed.

    Returns:
        (M, 2) float64: each column's (low, high).

    Example:
        >>> values = torch.tensor([[0.0], [1.0], [1.0], [0.0]] * 50)
        >>> low, high = bootstrap_intervals(values, Uncertainty(resamples=500)).squeeze(0).tolist()
        >>> low < 0.5 < high
        True
    """
    means = _resampled_means(values.double(), uncertainty, _bootstrap_weights)  # (R, M)
    alpha = 1.0 - uncertainty.confidence
    quantiles = torch.tensor([alpha / 2, 1.0 - alpha / 2], dtype=torch.float64)
    return torch.quantile(means, quantiles, dim=0).T  # (M, 2)


def metric_intervals(ranks: torch.Tensor, ks: Sequence[int], uncertainty: Uncertainty) -> dict[str, list[float]]:
    """{metric: [low, high]} of every ranking metric of `ranks` (U,) (U >= 1); {} when `uncertainty` is off.

    Example:
        >>> metric_intervals(torch.tensor([0, 3] * 50), ks=(1,), uncertainty=Uncertainty(resamples=300))["mrr"]
        [0.5575, 0.7]
    """
    if not uncertainty.resamples:
        return {}
    names, values = per_user_metrics(ranks, ks)
    return dict(zip(names, bootstrap_intervals(values, uncertainty).tolist(), strict=True))


def paired_difference(
    values_a: torch.Tensor, values_b: torch.Tensor, names: Sequence[str], uncertainty: Uncertainty
) -> list[PairedDifference]:
    """Model a minus model b on every metric over the same users: the difference of means, its paired-bootstrap
    interval and the p-value of a two-sided paired randomisation (sign-flip) test.

    Args:
        values_a, values_b: (U, M) per-user values of the two models, rows the same users in the same order.
        names: the M metric names.
        uncertainty: resamples (> 0), confidence and seed.

    Example:
        >>> a, b = torch.tensor([[1.0], [0.0]] * 100), torch.tensor([[0.0], [0.0]] * 100)
        >>> (d,) = paired_difference(a, b, ["hit"], Uncertainty(resamples=200))
        >>> d.difference, d.low > 0, d.p_value < 0.01
        (0.5, True, True)
    """
    if values_a.shape != values_b.shape:
        raise ValueError(
            f"a paired comparison needs the same users in both: {tuple(values_a.shape)} vs {tuple(values_b.shape)} "
            "(users x metrics). Fix: evaluate both models on the same split"
        )
    differences = values_a.double() - values_b.double()  # (U, M)
    observed = differences.mean(dim=0)  # (M,)
    intervals = bootstrap_intervals(differences, uncertainty)  # (M, 2)
    flipped = _resampled_means(differences, uncertainty, _sign_flips)  # (R, M)
    extreme = (flipped.abs() >= observed.abs() - 1e-12).sum(dim=0)  # (M,) ties count: a zero difference gives p = 1
    p_values = (1.0 + extreme) / (1.0 + uncertainty.resamples)
    rows = zip(names, observed.tolist(), *intervals.T.tolist(), p_values.tolist(), strict=True)
    return [PairedDifference(name, d, low, high, p, len(differences)) for name, d, low, high, p in rows]


def seed_summary(values: Sequence[float]) -> dict[str, float | int]:
    """Mean and sample standard deviation (ddof 1; 0 for one seed) of a metric over seeds.

    Example:
        >>> seed_summary([0.1, 0.2, 0.3])
        {'mean': 0.2, 'std': 0.1, 'seeds': 3}
    """
    if not values:
        raise ValueError("seed_summary of no seeds. Fix: pass at least one seed's value")
    mean = math.fsum(values) / len(values)
    spread = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return {"mean": round(mean, 12), "std": round(math.sqrt(spread), 12), "seeds": len(values)}


def _bootstrap_weights(users: int, chunk: int, generator: torch.Generator) -> torch.Tensor:
    """(C, U) float64: how many times each user is drawn in each of `chunk` resamples of `users` draws."""
    drawn = torch.randint(users, (chunk, users), generator=generator)  # (C, U) user indices
    counts = torch.zeros(chunk, users, dtype=torch.float64)
    return counts.scatter_add_(1, drawn, torch.ones(chunk, users, dtype=torch.float64))


def _sign_flips(users: int, chunk: int, generator: torch.Generator) -> torch.Tensor:
    """(C, U) float64 of random +1 / -1."""
    return torch.randint(2, (chunk, users), generator=generator).double().mul_(2.0).sub_(1.0)


def _resampled_means(values: torch.Tensor, uncertainty: Uncertainty, weights_of: Weights) -> torch.Tensor:
    """(R, M): the mean of every column of `values` (U, M) under each of R resampling weight rows, a chunk at a
    time; `weights_of(U, C, generator)` draws a chunk's (C, U) weights."""
    if uncertainty.resamples < 1:
        raise ConfigError("intervals need resamples. Fix: set eval.uncertainty.resamples to a positive count")
    users = len(values)
    if users == 0:
        raise ValueError("no users to resample. Fix: pass at least one user's values")
    generator = torch.Generator().manual_seed(uncertainty.seed)
    chunk = max(1, CHUNK_ELEMENTS // users)
    means = [
        weights_of(users, min(chunk, uncertainty.resamples - start), generator) @ values / users  # (C, M)
        for start in range(0, uncertainty.resamples, chunk)
    ]
    return torch.cat(means)
