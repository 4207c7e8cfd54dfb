"""Evaluation protocols, metrics, slices and the tasks beside ranking."""

from recsys.evaluation.metrics import catalog_coverage, ranking_metrics, target_ranks
from recsys.evaluation.protocol import DEFAULT_KS, EvalConfig, EvalResult, UserSample, evaluate
from recsys.evaluation.tasks import evaluate_tasks
from recsys.evaluation.uncertainty import Uncertainty
from recsys.inference import Scorer

__all__ = [
    "DEFAULT_KS",
    "EvalConfig",
    "EvalResult",
    "Scorer",
    "Uncertainty",
    "UserSample",
    "catalog_coverage",
    "evaluate",
    "evaluate_tasks",
    "ranking_metrics",
    "target_ranks",
]
