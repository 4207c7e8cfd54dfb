"""Quality benchmark: train a frozen config on a data set with the platform's evaluation protocol; write JSON.

Usage:
    .venv/bin/python -m benchmarks.quality --config configs/beauty/sasrec.yaml --data-dir ../shared/data/amazon-beauty
    .venv/bin/python -m benchmarks.quality --config configs/synthetic/sasrec.yaml  # generated data
    .venv/bin/python -m benchmarks.quality --config configs/beauty/sasrec.yaml --seeds 3  # train.seed, +1, +2

Runs the config's pipeline until its train step (prepare, content embeddings and semantic IDs when the config has a
`sid` section, train) and writes benchmarks/results/<config name>.json with the dataset, protocol, the config's
settings, valid/test metrics, training time (total, median seconds per epoch), best epoch, machine, versions and
how to reproduce it. With `--seeds N`, the config is trained N times (train.seed = its seed + i; the runs after the
first under the name `<name>-seed<seed>`, `seeded`): the result's `metrics` stay the first seed's, `seeds` gives every
seed's metrics, `over_seeds` each test metric's mean and sample std over the N seeds and `mean` each valid and test
metric's mean (`mean.test.recall@10`). Each run trains afresh;
`--resume` continues a time-boxed one (`--set train.max_train_seconds=S`, then a larger S) from the training state it
left in the work dir.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, log_to_console, provenance, reproduce_of, write_result
from benchmarks.moved import renamed_keys
from pipelines.config import ExperimentConfig, load_config
from pipelines.runner import run_pipeline
from pipelines.steps import ExperimentPaths, PipelineOutputs
from recsys.evaluation.uncertainty import seed_summary
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.semantic_ids.codes import read_semantic_ids
from recsys.training.recipes import NextItemTraining

# what the benchmark sets for itself (where it tracks, no progress bars): not part of what a result reproduces
UNRECORDED = ("tracking", "train.progress")
LOSS_KEY, AUTO_LOSS = "model.training.loss", "auto"


def load_settings(config: Path, overrides: dict[str, Any]) -> ExperimentConfig:
    return load_config(config, overrides)


def settings_record(config: ExperimentConfig, num_items: int | None = None) -> dict[str, Any]:
    """What a result records of its config: every section but tracking, the model's training settings resolved (with
    `num_items`, the loss `auto` trains on that catalogue)."""
    record = config.model_dump(mode="json", exclude={"tracking"})
    record["model"]["training"] = config.model.training_record()
    if num_items is not None and record["model"]["training"].get("loss") == AUTO_LOSS:
        record["model"]["training"]["loss"] = _trained_loss(config, num_items)
    return record


def _trained_loss(config: ExperimentConfig, num_items: int) -> str:
    training = config.model.training_settings()
    assert isinstance(training, NextItemTraining)  # the one family with a loss setting
    return training.resolved_loss(num_items)


def recorded_mismatches(
    result: dict[str, Any], config: ExperimentConfig, num_items: int | None = None
) -> Iterator[str]:
    """The settings the result records (`settings`, by section) that differ from `config`'s; a loss is compared as
    trained (`auto` decided for the catalogue: `num_items`, else the result's dataset's)."""
    items = num_items if num_items is not None else result.get("dataset", {}).get("items")
    expected = settings_record(config, items)
    recorded = renamed_keys(result.get("settings", {}))  # a result of before a key moved
    for dotted, value in _leaves(recorded):
        if dotted.startswith(UNRECORDED):
            continue
        if dotted == LOSS_KEY and value == AUTO_LOSS and items is not None:
            value = _trained_loss(config, items)
        actual = _lookup(expected, dotted)
        if actual != value:
            yield f"settings {dotted}: the result has {value!r}, the config {actual!r}"
    if "settings" not in result:
        yield "no `settings` recorded"


def seeded(config: ExperimentConfig, offset: int) -> ExperimentConfig:
    """`config` trained with train.seed + `offset`, under a name of its own (its own model directory) unless offset 0.

    Example:
        >>> from pipelines.config import ExperimentConfig
        >>> later = seeded(ExperimentConfig(name="beauty-sasrec"), 2)
        >>> later.name, later.train.seed
        ('beauty-sasrec-seed2', 2)
    """
    if offset == 0:
        return config
    seed = config.train.seed + offset
    return config.model_copy(update={"name": f"{config.name}-seed{seed}", "train": replace(config.train, seed=seed)})


def train_seeds(
    config: ExperimentConfig, work: Path, seeds: int, until: str, rerun: list[str], wait_s: float = 0.0
) -> list[PipelineOutputs]:
    """The pipeline of `config` until step `until` under `work`, once per seed (`seeded`, offsets 0..seeds-1);
    `wait_s`: how long to queue behind another process running the same pipeline (0: fail at once, naming it)."""
    return [
        run_pipeline(seeded(config, offset), work, until=until, rerun=rerun, wait_s=wait_s)[0]
        for offset in range(seeds)
    ]


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--data-dir", type=Path, help="raw input of the config's data source (none for a generated one: synthetic)"
    )
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench"), help="prepared data, models, MLflow")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the training state an earlier (time-boxed) run left in the work dir; default: train afresh",
    )
    parser.add_argument("--seeds", type=int, default=1, help="train N times, train.seed + 0..N-1: mean and std")
    args = parser.parse_args(argv)
    log_to_console()
    logging.getLogger("mlflow").setLevel(logging.ERROR)

    reproduce = reproduce_of(__name__, args, {} if args.data_dir is None else {"data.path": str(args.data_dir)})
    overrides = reproduce.overrides
    work = args.work_dir.resolve()
    config = load_config(args.config, {**overrides, **work_overrides(work)})
    paths = ExperimentPaths.under(work, config)
    device = resolve_device(config.train.hardware.device)
    start = time.perf_counter()
    # a benchmark measures a whole run from scratch, not the rest of an earlier one (unless asked to resume)
    rerun = [] if args.resume else ["train_retriever"]
    runs = train_seeds(config, work, args.seeds, "train_retriever", rerun)
    outputs = runs[0]
    assert outputs.model is not None
    m = outputs.model.metrics
    meta = json.loads((paths.data_dir / "meta.json").read_text())
    result = {
        "dataset": {**dataset_record(args.data_dir, config), **meta.get("counts", {})},
        "protocol": {
            "split": "leave-one-out per user: last item = test, second-to-last = valid, rest = train",
            "ranking": "full (all items, no sampled negatives)",
            "exclude_seen": config.eval.exclude_seen,
            "checkpoint": f"best validation {config.train.schedule.monitor}",
            "ks": list(config.eval.ks),
        },
        "settings": settings_record(config, meta.get("counts", {}).get("items")),
        "resumed": args.resume,
        "metrics": {split: m[split] for split in ("valid", "test", "test_warm", "test_cold") if split in m},
        "train_seconds": round(m["train_seconds"], 1),
        "seconds_per_epoch": round(m["seconds_per_epoch"], 2),
        "valid_seconds_per_epoch": round(m.get("valid_seconds_per_epoch", 0.0), 2),
        "best_epoch": m["best_epoch"],
        "epochs_run": m["epochs_run"],
        "wall_seconds": round(time.perf_counter() - start, 1),
        "device": str(device),
        "bf16_autocast": use_bf16_autocast(config.train.hardware.precision, device),
        **provenance(),
        "semantic_ids": semantic_id_health(outputs.semantic_ids.path) if outputs.semantic_ids else None,
        "mlflow_run_id": outputs.model.run_id,
        **(over_seeds(config, runs) if args.seeds > 1 else {}),
    }
    path = write_result(config.name, result, args.results_dir, reproduce)
    test = m["test"]
    print(
        f"{config.name}: test R@10 {test['recall@10']:.4f} N@10 {test['ndcg@10']:.4f} "
        f"R@5 {test['recall@5']:.4f} N@5 {test['ndcg@5']:.4f} | best epoch {m['best_epoch']} | "
        f"{m['seconds_per_epoch']:.1f} s/epoch (train), {m['train_seconds']:.0f} s total -> {path}"
    )
    if args.seeds > 1:
        summary = result["over_seeds"]["test"]["ndcg@10"]
        print(f"{config.name}: test N@10 {summary['mean']:.4f} ± {summary['std']:.4f} over {args.seeds} seeds")
    return path


def over_seeds(config: ExperimentConfig, runs: list[PipelineOutputs]) -> dict[str, Any]:
    """`seeds`: each run's seed, valid/test metrics, best epoch and training time; `over_seeds`: each test metric's
    mean and sample std over the runs (`recsys.evaluation.uncertainty.seed_summary`); `mean`: each valid and test
    metric's mean alone (`mean.test.ndcg@10`)."""
    records = []
    for offset, run in enumerate(runs):
        assert run.model is not None
        m = run.model.metrics
        records.append({"seed": seeded(config, offset).train.seed, "valid": m["valid"], "test": m["test"],
                        "best_epoch": m["best_epoch"], "train_seconds": round(m["train_seconds"], 1)})  # fmt: skip
    test = {metric: seed_summary([r["test"][metric] for r in records]) for metric in records[0]["test"]}
    means = {split: {metric: seed_summary([r[split][metric] for r in records])["mean"] for metric in records[0][split]}
             for split in ("valid", "test")}  # fmt: skip
    return {"seeds": records, "over_seeds": {"test": test}, "mean": means}


def semantic_id_health(path: Path) -> dict[str, Any]:
    """The health of built semantic IDs (codebook use, collisions, ...) and how they were built."""
    sids, stats = read_semantic_ids(path)
    return {"codebook_sizes": list(sids.codebook_sizes), **stats.to_dict(), "build": sids.meta}


def dataset_record(data_path: Path | str | None, config: ExperimentConfig) -> dict[str, Any]:
    """Name and origin of a benchmark's data: the input directory, or the generating source and its options."""
    if data_path is None:
        return {"name": config.data.source, "options": config.data.options}
    return {"name": Path(data_path).resolve().name, "path": str(data_path)}


def work_overrides(work: Path) -> dict[str, Any]:
    """What a benchmark run changes in an experiment config: MLflow in its work dir, no progress bars."""
    return {"tracking.uri": f"sqlite:///{work / 'mlflow.db'}", "train.progress": False}


def _leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value of a nested mapping that is not itself a mapping (an empty one records
    nothing)."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return "<absent>"
        tree = tree[key]
    return tree


if __name__ == "__main__":
    main()
