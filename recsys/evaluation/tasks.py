"""The tasks beside ranking (`recsys.data.tasks`): a multi-task scorer's predictions for each user's held-out item,
against that interaction's labels; AUC for binary tasks, RMSE for regression. Targets whose label the data does
not know are left out (and counted apart). A scorer with category tasks (`CategoryScorer`: the ranker's
`category_tasks`) also gets each one's accuracy: the predicted category of the held-out item at that level against
its own (items without a category at that level left out), beside two baselines that need no model: the category of
the user's last item, and the most frequent category among the evaluated targets (an upper bound on any constant
guess).

Dimension letters: U users of the split, T tasks.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

import torch

from recsys.data.prepared import EvalSplit
from recsys.evaluation.metrics import auc, rmse
from recsys.evaluation.protocol import history_batches
from recsys.inference import MultiTaskScorer

logger = logging.getLogger(__name__)


@runtime_checkable
class CategoryScorer(Protocol):
    """A model that predicts the next item's category at each level (the ranker with `category_tasks`)."""

    @property
    def category_tasks(self) -> tuple[str, ...]: ...

    def item_categories(self, items: torch.Tensor) -> torch.Tensor:
        """(B,) items -> (B, K) their category ids at the predicted levels (0: none)."""
        ...

    def category_hits(self, histories: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, L) histories, (B,) items -> (K, B): 1 right, 0 wrong, NaN where the item has no such category."""
        ...


@torch.no_grad()
def evaluate_tasks(scorer: MultiTaskScorer, split: EvalSplit, batch_size: int = 1024) -> dict[str, dict[str, float]]:
    """{task: {"auc" or "rmse", "users": labelled targets, ["positives"]}} for every task of `scorer`.

    Args:
        scorer: a model with `task_predictions` (the two-stage ranker with tasks).
        split: histories, held-out targets and their labels (`SequenceData.eval_split`).
        batch_size: users per model call.
    """
    report = {}
    if isinstance(scorer, CategoryScorer):
        report = _category_accuracy(scorer, scorer.max_history, split, batch_size)
    if not scorer.tasks:
        return report
    predictions = torch.empty(len(scorer.tasks), len(split.targets))  # (T, U)
    for rows, histories, width in history_batches(split, scorer.max_history, batch_size):
        predictions[:, rows] = scorer.task_predictions(
            histories.to_padded(width), split.targets[rows], split.user_idx[rows]
        ).cpu()
    for task, predicted in zip(scorer.tasks, predictions, strict=True):
        if task.name not in split.target_labels:
            logger.warning("task %s: the evaluated data has no labels for it; not measured", task.name)
            continue
        labels = split.target_labels[task.name]
        known = ~labels.isnan()
        if task.kind == "binary":
            metrics = {"auc": auc(predicted[known], labels[known]), "positives": float(labels[known].sum())}
        else:
            metrics = {"rmse": rmse(predicted[known], labels[known])}
        report[task.name] = {**metrics, "users": float(known.sum())}
    return report


def _category_accuracy(
    scorer: CategoryScorer, max_history: int, split: EvalSplit, batch_size: int
) -> dict[str, dict[str, float]]:
    """{category_l<k>: {"accuracy", "last_item_accuracy", "majority_accuracy", "users": targets with a category at
    level k}}."""
    if not scorer.category_tasks:
        return {}
    hits = torch.empty(len(scorer.category_tasks), len(split.targets))  # (K, U)
    last_item = torch.empty(len(scorer.category_tasks), len(split.targets), dtype=torch.long)  # (K, U)
    for rows, histories, width in history_batches(split, max_history, batch_size):
        padded = histories.to_padded(width)  # left-padded: the last column is each user's latest item
        hits[:, rows] = scorer.category_hits(padded, split.targets[rows]).cpu()
        last_item[:, rows] = scorer.item_categories(padded[:, -1]).T.cpu()
    truth = scorer.item_categories(split.targets).T.cpu()  # (K, U), 0: no category at that level
    report = {}
    for name, level_hits, level_truth, level_last in zip(scorer.category_tasks, hits, truth, last_item, strict=True):
        known = level_truth > 0
        if not bool(known.any()):
            report[name] = {"accuracy": float("nan"), "users": 0.0}
            continue
        majority = level_truth[known].bincount().max()
        report[name] = {
            "accuracy": float(level_hits[known].mean()),
            "last_item_accuracy": float((level_last[known] == level_truth[known]).float().mean()),
            "majority_accuracy": float(majority) / float(known.sum()),
            "users": float(known.sum()),
        }
    return report
