"""The tasks beside ranking (`recsys.data.tasks`): a multi-task scorer's predictions for each user's held-out item,
against that interaction's labels; AUC for binary tasks, RMSE for regression. Targets whose label the data does
not know are left out (and counted apart).

Dimension letters: U users of the split, T tasks.
"""

from __future__ import annotations

import logging

import torch

from recsys.data.prepared import EvalSplit
from recsys.evaluation.metrics import auc, rmse
from recsys.evaluation.protocol import history_batches
from recsys.inference import MultiTaskScorer

logger = logging.getLogger(__name__)


@torch.no_grad()
def evaluate_tasks(scorer: MultiTaskScorer, split: EvalSplit, batch_size: int = 1024) -> dict[str, dict[str, float]]:
    """{task: {"auc" or "rmse", "users": labelled targets, ["positives"]}} for every task of `scorer`.

    Args:
        scorer: a model with `task_predictions` (the two-stage ranker with tasks).
        split: histories, held-out targets and their labels (`SequenceData.eval_split`).
        batch_size: users per model call.
    """
    if not scorer.tasks:
        return {}
    predictions = torch.empty(len(scorer.tasks), len(split.targets))  # (T, U)
    for rows, histories, width in history_batches(split, scorer.max_history, batch_size):
        predictions[:, rows] = scorer.task_predictions(
            histories.to_padded(width), split.targets[rows], split.user_idx[rows]
        ).cpu()
    report = {}
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
