"""Evaluation protocols, metrics and slices."""

from recsys.evaluation.metrics import catalog_coverage, ranking_metrics, target_ranks
from recsys.evaluation.protocol import DEFAULT_KS, EvalConfig, EvalResult, evaluate
from recsys.inference import Scorer

__all__ = [
    "DEFAULT_KS",
    "EvalConfig",
    "EvalResult",
    "Scorer",
    "catalog_coverage",
    "evaluate",
    "ranking_metrics",
    "target_ranks",
]
