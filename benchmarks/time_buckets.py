"""HSTU time buckets: test metrics by the gap between the request and the user's last event; writes JSON.

Usage (after training both configs with benchmarks/quality.py into the same work dir):
    .venv/bin/python benchmarks/quality.py --config configs/synthetic-sessions-hstu.yaml \
        --work-dir .cache/bench-sessions
    .venv/bin/python benchmarks/quality.py --config configs/synthetic-sessions-hstu-time.yaml \
        --work-dir .cache/bench-sessions
    .venv/bin/python benchmarks/time_buckets.py --work-dir .cache/bench-sessions

Loads both trained models (positions only; positions + time buckets), evaluates the test split once per model and
splits it by the gap between the held-out item (the request) and the last history item: within the session
(< 1 h) or a new one. The data's new sessions switch the user's focus, so time has a signal to find there.
Also records the learned time bias per bucket (first layer, per head). Writes
benchmarks/results/time-buckets-synthetic.json.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, versions, write_result
from pipelines.model_dir import load_model_dir
from recsys.evaluation import EvalConfig, evaluate
from recsys.evaluation.slices import slice_metrics
from recsys.models.hstu import HSTU

CONFIGS = {"positions": "synthetic-sessions-hstu", "positions + time buckets": "synthetic-sessions-hstu-time"}
NEW_SESSION_SECONDS = 3_600
KS = (10,)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench-sessions"))
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    rows = {}
    for label, name in CONFIGS.items():
        model_dir = args.work_dir / "models" / name
        if not model_dir.is_dir():
            raise SystemExit(f"{model_dir} is missing. Fix: run the quality.py commands in this script's docstring")
        trained = load_model_dir(model_dir)
        assert isinstance(trained.model, HSTU)
        split = trained.data.eval_split("test")
        assert split.timestamps is not None and split.request_times is not None
        new_session = split.request_times - split.timestamps.last(1) >= NEW_SESSION_SECONDS
        ranks = evaluate(trained.model.eval(), split, trained.data.num_items, EvalConfig(ks=KS)).ranks
        bias = trained.model.layers[0].time_bias
        rows[label] = {
            "config": f"configs/{name}.yaml",
            "all": slice_metrics(ranks, torch.ones_like(new_session), KS),
            "same_session": slice_metrics(ranks, ~new_session, KS),
            "new_session": slice_metrics(ranks, new_session, KS),
            "time_bias_layer1": None if bias is None else bias.detach().round(decimals=3).tolist(),
        }
        print(
            f"{label}: N@10 all {rows[label]['all']['ndcg@10']:.4f}, same session "
            f"{rows[label]['same_session']['ndcg@10']:.4f}, new session {rows[label]['new_session']['ndcg@10']:.4f}"
        )
    result = {
        "name": "time-buckets-synthetic",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {"new_session_seconds": NEW_SESSION_SECONDS, "split": "test", "ks": list(KS)},
        "models": rows,
        "machine": machine(),
        "versions": versions(),
        "command": command(),
    }
    path = write_result(result["name"], result, args.results_dir)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
