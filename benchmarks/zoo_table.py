"""The Retrieval-zoo table: every model's test metrics and training time, from the quality JSONs; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.zoo_table [--config benchmarks/configs/retrieval-zoo.yaml]

Reads benchmarks/results/<result>.json, written by benchmarks.quality, for each row of the config's tables, prints a
markdown table per data set and writes benchmarks/results/retrieval-zoo.json. A row whose JSON is missing is an
error (run its config first), so the table never silently drops a model. Each row names the experiment config in
the repo that made its result (the result's own `reproduce.config`, else <dataset>/<stem>.yaml of its name, under
configs/ or benchmarks/configs/).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, benchmark_parser, command, parse_run, settings_from, write_result
from benchmarks.moved import config_path, renamed_key

METRICS = ("recall@5", "ndcg@5", "recall@10", "ndcg@10")
BUDGET_KEY = "train.schedule.max_seconds"


@dataclass(frozen=True)
class Row:
    label: str  # the model, as the table shows it
    result: str  # the quality result's name: RESULTS_DIR/<result>.json


@dataclass(frozen=True)
class Settings:
    tables: dict[str, tuple[Row, ...]]  # data set -> its rows, in order


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """The tables' data sets and rows (model, JSON) that differ from the config's."""
    recorded = result.get("tables", {})
    if list(recorded) != list(settings.tables):
        yield f"tables: the result has {list(recorded)}, the config {list(settings.tables)}"
    for data, rows in settings.tables.items():
        got = [(r["model"], r["json"]) for r in recorded.get(data, [])]
        expected = [(r.label, f"{r.result}.json") for r in rows]
        if got != expected:
            yield f"tables.{data}: the result has rows {got}, the config {expected}"


def row(label: str, name: str, results_dir: Path) -> dict[str, Any]:
    path = results_dir / f"{name}.json"
    config = experiment_config(name)
    if not path.is_file():
        raise SystemExit(f"{path} is missing. Fix: run .venv/bin/python -m benchmarks.quality --config {config} first")
    result = json.loads(path.read_text())
    config = config_path(result.get("reproduce", {}).get("config", config))  # where that config is today
    if not (REPO / config).is_file():
        raise SystemExit(
            f"{path}: its config {config} is not in the repo. Fix: re-run it from a config in configs/ or "
            "benchmarks/configs/"
        )
    test = result["metrics"]["test"]
    budget = time_budget(result)
    cuda = result["device"] == "cuda"
    return {
        "model": label,
        "config": config,
        **{m: round(test[m], 4) for m in METRICS},
        "train_seconds": result["train_seconds"],
        "seconds_per_epoch": result["seconds_per_epoch"],
        "best_epoch": result["best_epoch"],
        # the time budget ended training (rather than early stopping or the epoch cap)
        "time_boxed": f"{budget:g} s" if budget is not None and result["train_seconds"] >= budget else None,
        "device": result["machine"].get("gpu") if cuda else f"CPU, {result['machine']['cpu_cores']} cores",
        "json": path.name,
    }


def experiment_config(name: str) -> str:
    """The experiment config a result name comes from: configs/<dataset>/<stem>.yaml for `<dataset>-<stem>`, or the
    laboratory's benchmarks/configs/<dataset>/<stem>.yaml."""
    dataset, _, stem = name.partition("-")
    return config_path(f"configs/{dataset}/{stem}.yaml")


def time_budget(result: dict[str, Any]) -> float | None:
    """The training budget in seconds the result ran under (`train.schedule.max_seconds`, recorded under its old
    name by earlier results), None without one: from its `reproduce` overrides, else the `--set KEY=VALUE` strings of
    results written before it had one."""
    overrides = {renamed_key(key): value for key, value in result.get("reproduce", {}).get("overrides", {}).items()}
    if overrides.get(BUDGET_KEY) is not None:
        return float(overrides[BUDGET_KEY])
    sets = [o.partition("=") for o in result.get("overrides", [])]
    budgets = [float(value) for key, _, value in sets if renamed_key(key) == BUDGET_KEY]
    return budgets[-1] if budgets else None


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | R@5 | N@5 | R@10 | N@10 | training | JSON |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        time = f"{r['train_seconds']:,.0f} s" if r["train_seconds"] >= 1 else "-"
        if r["seconds_per_epoch"]:
            time += f" ({r['seconds_per_epoch']:.1f} s/epoch, best epoch {r['best_epoch']})"
        if r["time_boxed"]:
            time += f", stopped by a {r['time_boxed']} budget"
        figures = " | ".join(f"{r[m]:.4f}" for m in METRICS)
        lines.append(f"| {r['model']} | {figures} | {time}, {r['device']} | `{r['json']}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/retrieval-zoo.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    tables = {data: [row(r.label, r.result, args.results_dir) for r in rows] for data, rows in settings.tables.items()}
    for data, rows in tables.items():
        print(f"\n{data}\n{markdown(rows)}")
    result = {
        "protocol": "leave-one-out, all items ranked, nothing excluded, checkpoint on validation NDCG@10; test split",
        "tables": tables,
        "command": command(),
    }
    path = write_result("retrieval-zoo", result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
