"""Prediction tasks beside the next item: labels of each interaction that the prepared data carries.

A task is read off an optional interaction column (`recsys.data.schema`):

    event:<name>   binary: 1 where the interaction's `event` is <name>. One task per event type but the most
                   frequent one, the base every interaction has (e.g. "event:purchase" where most events are clicks).
    value          regression on the interaction's `value` (e.g. a rating).

A ranker predicts them for the item it ranks (multi-task heads); a task's label is that of the user's interaction
with the item, so tasks are trained and measured on interacted items (a held-out target, a training target). A label
the data does not know (a null) is NaN, and counts in no loss and no metric.

Example:
    >>> import polars as pl
    >>> frame = pl.DataFrame({"event": ["click", "buy", "click"], "value": [4.0, 5.0, 1.0]})
    >>> tasks_in(frame)
    (Task(name='event:buy', kind='binary'), Task(name='value', kind='regression'))
    >>> task_labels(frame.with_columns(pl.Series("value", [4.0, None, 1.0])), tasks_in(frame))
    {'event:buy': tensor([0., 1., 0.]), 'value': tensor([4., nan, 1.])}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from recsys.data.schema import EVENT, VALUE

if TYPE_CHECKING:  # reading labels off a table; a model predicting tasks needs no table
    import polars as pl

EVENT_PREFIX = f"{EVENT}:"
TaskKind = Literal["binary", "regression"]


@dataclass(frozen=True)
class Task:
    name: str
    kind: TaskKind


def task_kind(name: str) -> TaskKind:
    """The kind of a task by its name; ValueError naming the known forms otherwise."""
    if name.startswith(EVENT_PREFIX) and len(name) > len(EVENT_PREFIX):
        return "binary"
    if name == VALUE:
        return "regression"
    raise ValueError(f"unknown task {name!r}: tasks are '{EVENT_PREFIX}<event type>' or '{VALUE}'")


def tasks_in(interactions: pl.DataFrame) -> tuple[Task, ...]:
    """The tasks whose labels `interactions` holds: its `event` types but the most frequent one, then `value`."""
    tasks = []
    if EVENT in interactions.columns:
        counts = interactions[EVENT].drop_nulls().value_counts().iter_rows()
        by_frequency = [name for name, _ in sorted(counts, key=lambda row: (-row[1], row[0]))]
        tasks += [Task(f"{EVENT_PREFIX}{name}", "binary") for name in sorted(by_frequency[1:])]
    if VALUE in interactions.columns and interactions[VALUE].drop_nulls().len() > 0:
        tasks.append(Task(VALUE, "regression"))
    return tuple(tasks)


def task_labels(interactions: pl.DataFrame, tasks: Sequence[Task]) -> dict[str, torch.Tensor]:
    """(N,) float32 labels of every interaction for each task, NaN where the data does not know it."""
    import polars as pl

    labels = {}
    for task in tasks:
        binary = pl.col(EVENT) == task.name.removeprefix(EVENT_PREFIX)
        column = binary if task.kind == "binary" else pl.col(VALUE)
        values = interactions.select(column.cast(pl.Float32)).to_series().fill_null(float("nan"))
        labels[task.name] = values.to_torch()
    return labels
