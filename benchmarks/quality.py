"""Quality benchmark: train a frozen config on a data set with the DESIGN.md protocol; write JSON.

Usage:
    .venv/bin/python benchmarks/quality.py --config configs/beauty-sasrec.yaml --data-dir ../shared/data/amazon-beauty
    .venv/bin/python benchmarks/quality.py --config configs/synthetic-sessions-hstu-time.yaml  # generated data

Writes benchmarks/results/<config name>.json with the dataset, protocol, model, valid/test metrics,
training time (total, median seconds per epoch), best epoch, machine, versions and the command. Each run
trains afresh; `--resume` continues a time-boxed one (`--set train.max_train_seconds=S`, then a larger S)
from the training state it left in the work dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, parse_overrides, versions, write_result
from pipelines.config import load_config
from pipelines.experiment import ExperimentPaths, run_experiment
from pipelines.train import training_state_path
from recsys.runtime.device import resolve_device, use_bf16_autocast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="frozen experiment YAML (configs/)")
    parser.add_argument(
        "--data-dir", type=Path, help="raw input of the config's data source (none for a generated one: synthetic)"
    )
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench"), help="prepared data, models, MLflow")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. --set train.epochs=40 --set tracking.enabled=false",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the training state an earlier (time-boxed) run left in the work dir; default: train afresh",
    )
    args = parser.parse_args()
    # force: importing torchrec (through the model registry) already put a WARNING-level handler on the root
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("mlflow").setLevel(logging.ERROR)

    work = args.work_dir.resolve()
    overrides = {"tracking.uri": f"sqlite:///{work / 'mlflow.db'}", "train.progress": False}
    if args.data_dir is not None:
        overrides["data.path"] = str(args.data_dir)
    overrides.update(parse_overrides(args.set))
    config = load_config(args.config, overrides)
    paths = ExperimentPaths.under(work, config)
    if not args.resume:  # a benchmark measures a whole run, not the rest of an earlier one
        training_state_path(paths.model_dir).unlink(missing_ok=True)
    device = resolve_device(config.train.device)
    start = time.perf_counter()
    outputs = run_experiment(config, paths)
    m = outputs.metrics
    meta = _read_meta(paths.data_dir)
    result = {
        "name": config.name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "dataset": {**_dataset(args.data_dir, config.data.source, config.data.options), **meta.get("counts", {})},
        "protocol": {
            "split": "leave-one-out per user: last item = test, second-to-last = valid, rest = train",
            "ranking": "full (all items, no sampled negatives)",
            "exclude_seen": config.eval.exclude_seen,
            "checkpoint": f"best validation {config.train.monitor}",
            "ks": list(config.eval.ks),
        },
        "model": {"name": config.model.name, **config.model.params},
        "overrides": args.set,
        "resumed": args.resume,
        "train": config.train.__dict__,
        "metrics": {split: m[split] for split in ("valid", "test", "test_warm", "test_cold") if split in m},
        "train_seconds": round(m["train_seconds"], 1),
        "seconds_per_epoch": round(m["seconds_per_epoch"], 2),
        "valid_seconds_per_epoch": round(m.get("valid_seconds_per_epoch", 0.0), 2),
        "best_epoch": m["best_epoch"],
        "epochs_run": m["epochs_run"],
        "wall_seconds": round(time.perf_counter() - start, 1),
        "device": str(device),
        "bf16_autocast": use_bf16_autocast(config.train.precision, device),
        "machine": machine(),
        "versions": versions(),
        "semantic_ids": _semantic_id_health(paths) if config.sid is not None else None,
        "mlflow_run_id": outputs.run_id,
        "command": command(),
    }
    path = write_result(config.name, result, args.results_dir)
    test = m["test"]
    print(
        f"{config.name}: test R@10 {test['recall@10']:.4f} N@10 {test['ndcg@10']:.4f} "
        f"R@5 {test['recall@5']:.4f} N@5 {test['ndcg@5']:.4f} | best epoch {m['best_epoch']} | "
        f"{m['seconds_per_epoch']:.1f} s/epoch (train), {m['train_seconds']:.0f} s total -> {path}"
    )


def _semantic_id_health(paths: ExperimentPaths) -> dict:
    from pipelines.semantic_ids import SEMANTIC_IDS_FILE
    from recsys.semantic_ids.codes import read_semantic_ids

    sids, stats = read_semantic_ids(paths.sid_dir / SEMANTIC_IDS_FILE)
    return {"codebook_sizes": list(sids.codebook_sizes), **stats.to_dict(), "build": sids.meta}


def _dataset(data_dir: Path | None, source: str, options: dict) -> dict:
    """Name and origin of the benchmark's data: the input directory, or the generating source and its options."""
    if data_dir is None:
        return {"name": source, "options": options}
    return {"name": data_dir.resolve().name, "path": str(data_dir)}


def _read_meta(data_dir: Path) -> dict:
    return json.loads((data_dir / "meta.json").read_text())


if __name__ == "__main__":
    main()
