"""HSTU time buckets: test metrics by the gap between the request and the user's last event; writes JSON.

Usage (after training the config's models with benchmarks.quality into the same work dir):
    .venv/bin/python -m benchmarks.quality --config benchmarks/configs/synthetic/sessions-hstu.yaml \
        --work-dir .cache/bench-sessions
    .venv/bin/python -m benchmarks.quality --config benchmarks/configs/synthetic/sessions-hstu-time.yaml \
        --work-dir .cache/bench-sessions
    .venv/bin/python -m benchmarks.time_buckets --work-dir .cache/bench-sessions

Loads the trained model of each experiment config of benchmarks/configs/time-buckets.yaml (WORK/models/<config
name>: positions only; positions + time buckets), evaluates the test split once per model and splits it by the gap
between the held-out item (the request) and the last history item: within the session (< new_session_seconds) or a
new one. The data's new sessions switch the user's focus, so time has a signal to find there. Also records the
learned time bias per bucket (first layer, per head). Writes benchmarks/results/time-buckets-synthetic.json.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, write_result
from pipelines.config import default_name, load_config
from recsys.artifacts.model_dir import load_model_dir
from recsys.evaluation import EvalConfig, evaluate
from recsys.evaluation.slices import slice_metrics

NAME = "time-buckets-synthetic"


@dataclass(frozen=True)
class Settings:
    models: dict[str, str]  # row label -> experiment config (a path in the repo) whose trained model it evaluates
    new_session_seconds: int  # a request this long after the user's last event starts a new session
    ks: tuple[int, ...]


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    config_names(settings)  # every experiment config must load
    return settings


def config_names(settings: Settings) -> dict[str, str]:
    """Row label -> the name of its experiment config (the model directory WORK/models/<name>)."""
    return {label: load_config(REPO / path).name for label, path in settings.models.items()}


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records (its session gap, ks, rows and their configs' names) that differs from the config."""
    recorded = result.get("config", {})
    for key, expected in (("new_session_seconds", settings.new_session_seconds), ("ks", list(settings.ks))):
        if recorded.get(key) != expected:
            yield f"config.{key}: the result has {recorded.get(key)!r}, the config {expected!r}"
    rows = result.get("models", {})
    if list(rows) != list(settings.models):
        yield f"models: the result has {list(rows)}, the config {list(settings.models)}"
    for label, name in config_names(settings).items():
        if label not in rows:
            continue
        # the name of the config the row was made from (a path in the layout of its day) is the model it read
        made_from = default_name(Path(rows[label]["config"]))
        if made_from != name:
            yield f"models.{label}: the result read the model of {made_from}, the config names {name}"


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/time-buckets.yaml")
    parser.add_argument(
        "--work-dir", type=Path, default=Path(".cache/bench-sessions"), help="where the models were trained"
    )
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    ks = settings.ks
    rows = {}
    for label, name in config_names(settings).items():
        model_dir = args.work_dir / "models" / name
        if not model_dir.is_dir():
            raise SystemExit(f"{model_dir} is missing. Fix: train {settings.models[label]} into it (this docstring)")
        trained = load_model_dir(model_dir)
        layers = getattr(trained.model, "layers", None)
        if not layers or not hasattr(layers[0], "time_bias"):
            raise SystemExit(
                f"{model_dir}: a {type(trained.model).__name__} has no per-layer time bias (layers[0].time_bias). "
                f"Fix: point {label!r} at an HSTU config (model.name: hstu)"
            )
        split = trained.data.eval_split("test")
        if split.timestamps is None or split.request_times is None:
            raise SystemExit(f"{model_dir}: its data has no timestamps. Fix: train it on data with event times")
        new_session = split.request_times - split.timestamps.last(1) >= settings.new_session_seconds
        ranks = evaluate(trained.model.eval(), split, trained.data.num_items, EvalConfig(ks=ks)).ranks
        slices = {
            "all": slice_metrics(ranks, torch.ones_like(new_session), ks),
            "same_session": slice_metrics(ranks, ~new_session, ks),
            "new_session": slice_metrics(ranks, new_session, ks),
        }
        bias = layers[0].time_bias
        rows[label] = {
            "config": settings.models[label],
            **slices,
            "time_bias_layer1": None if bias is None else bias.detach().round(decimals=3).tolist(),
        }
        ndcg = ", ".join(f"{part} {m.get(f'ndcg@{ks[0]}', float('nan')):.4f}" for part, m in slices.items())
        print(f"{label}: N@{ks[0]} {ndcg}")
    result = {
        "config": {"new_session_seconds": settings.new_session_seconds, "split": "test", "ks": list(ks)},
        "models": rows,
        **provenance(),
    }
    path = write_result(NAME, result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
