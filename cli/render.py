"""Rich tables for metrics and recommendations (CLI output only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

METRIC_COLUMNS = ("recall@5", "ndcg@5", "recall@10", "ndcg@10", "recall@50", "ndcg@50", "mrr", "coverage@10")
HISTORY_HEADER = "recent history (oldest first)"  # a recommendations table's first column, for a user's list
HEADERS = {"recall": "R", "ndcg": "N", "coverage": "Cov", "mrr": "MRR", "train_seconds": "train s"}


def metrics_table(title: str, rows: Mapping[str, Mapping[str, float]], extra: Sequence[str] = ()) -> Table:
    """One column per model/split, one row per metric: the standard metrics plus `extra` keys.

    Headers are abbreviated: R@k = Recall@k, N@k = NDCG@k, Cov@k = catalog coverage of the top-k lists.
    """
    table = Table(title=title, min_width=len(title) + 4)
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    for key in (*METRIC_COLUMNS, *extra):
        if any(key in metrics for metrics in rows.values()):
            table.add_row(_header(key), *(_fmt(metrics.get(key)) for metrics in rows.values()))
    return table


def comparison_table(title: str, comparison: Mapping[str, Any], rows: Mapping[str, Mapping[str, float]]) -> Table:
    """One row per metric compared (`recsys.artifacts.comparison`): each model's value, the difference (first minus
    second), its interval and p-value; `rows` = {model name: its metrics}, the challenger's first."""
    confidence = comparison["uncertainty"]["confidence"]
    table = Table(title=title, min_width=len(title) + 4)
    for header in ("metric", *rows, "difference", f"{confidence:.0%} interval", "p-value"):
        table.add_column(header, justify="left" if header == "metric" else "right")
    for key in METRIC_COLUMNS:
        paired = comparison["overall"].get(key)
        if paired is not None:
            interval = f"[{paired['low']:+.4f}, {paired['high']:+.4f}]"
            values = (_fmt(metrics.get(key)) for metrics in rows.values())
            table.add_row(_header(key), *values, f"{paired['difference']:+.4f}", interval, f"{paired['p_value']:.3g}")
    return table


def recommendations_table(
    title: str,
    history: Sequence[str],
    recommended: Sequence[tuple[str, float]],
    history_header: str = HISTORY_HEADER,
    list_header: str = "recommended next",
) -> Table:
    """The user's most recent items (or what else the list is for, under `history_header`), then the ranked
    recommendations (or another ranked list, under `list_header`) with their scores."""
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column(history_header)
    table.add_column(list_header)
    table.add_column("score", justify="right")
    for i in range(max(len(history), len(recommended))):
        past = history[i] if i < len(history) else ""
        title_, score = recommended[i] if i < len(recommended) else ("", float("nan"))
        table.add_row(str(i + 1), past, title_, "" if title_ == "" else f"{score:.3f}")
    return table


def print_tables(*tables: Table) -> None:
    console = Console()
    for table in tables:
        console.print(table)


def _header(key: str) -> str:
    """'recall@10' -> 'R@10', 'train_seconds' -> 'train s'."""
    name, at, k = key.partition("@")
    return f"{HEADERS.get(name, name)}{at}{k}"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
