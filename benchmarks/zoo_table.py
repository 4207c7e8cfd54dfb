"""The Retrieval-zoo table: every model's test metrics and training time, from the quality JSONs; writes JSON.

Usage:
    .venv/bin/python benchmarks/zoo_table.py

Reads benchmarks/results/<config>.json written by benchmarks/quality.py for each row below, prints a markdown
table per data set and writes benchmarks/results/retrieval-zoo.json. A row whose JSON is missing is an error
(run its config first), so the table never silently drops a model.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, write_result

METRICS = ("recall@5", "ndcg@5", "recall@10", "ndcg@10")
TABLES = {
    "amazon-beauty": [
        ("popularity", "beauty-popularity"),
        ("SASRec", "beauty-sasrec"),
        ("SASRec + SID features", "beauty-sasrec-sid"),
        ("SASRec + SID features, dim 128", "beauty-sasrec-sid-wide"),
        ("HSTU", "beauty-hstu"),
        ("HSTU, sampled softmax (1,024 negatives)", "beauty-hstu-sampled"),
        ("two-tower (id + SID + content)", "beauty-two-tower"),
        ("generative (TIGER-style)", "beauty-tiger-ema-wide"),
        ("fusion (RRF)", "beauty-fusion"),
    ],
    "amazon-sports": [
        ("popularity", "sports-popularity"),
        ("SASRec", "sports-sasrec"),
        ("HSTU", "sports-hstu"),
        ("two-tower (id)", "sports-two-tower"),
        ("fusion (RRF)", "sports-fusion"),
    ],
}


def row(label: str, config: str, results_dir: Path) -> dict[str, Any]:
    path = results_dir / f"{config}.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing. Fix: run benchmarks/quality.py --config configs/{config}.yaml first")
    result = json.loads(path.read_text())
    test = result["metrics"]["test"]
    prefix = "train.max_train_seconds="
    budget = [float(o.removeprefix(prefix)) for o in result.get("overrides", []) if o.startswith(prefix)]
    cuda = result["device"] == "cuda"
    return {
        "model": label,
        "config": f"configs/{config}.yaml",
        **{m: round(test[m], 4) for m in METRICS},
        "train_seconds": result["train_seconds"],
        "seconds_per_epoch": result["seconds_per_epoch"],
        "best_epoch": result["best_epoch"],
        # the time budget ended training (rather than early stopping or the epoch cap)
        "time_boxed": f"{budget[0]:g} s" if budget and result["train_seconds"] >= budget[0] else None,
        "device": result["machine"].get("gpu") if cuda else f"CPU, {result['machine']['cpu_cores']} cores",
        "json": path.name,
    }


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    tables = {data: [row(label, config, args.results_dir) for label, config in rows] for data, rows in TABLES.items()}
    for data, rows in tables.items():
        print(f"\n{data}\n{markdown(rows)}")
    result = {
        "name": "retrieval-zoo",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "protocol": "leave-one-out, all items ranked, nothing excluded, checkpoint on validation NDCG@10; test split",
        "tables": tables,
        "command": command(),
    }
    path = write_result("retrieval-zoo", result, args.results_dir)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
