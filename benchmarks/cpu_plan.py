"""CPU training speed of the defaults vs fixed threads and precisions: Beauty SASRec seconds per epoch; JSON.

Usage:
    .venv/bin/python -m benchmarks.cpu_plan          # needs ../shared/data/amazon-beauty; ~5 min on 2 cores

Settings: benchmarks/configs/cpu-plan.yaml (`--config`, `--set KEY=VALUE`). Each variant trains the experiment's model
from scratch for `epochs` epochs on the CPU (the pipeline until its train step, tracking off, data prepared once) and
records the median training seconds of its epochs; what `precision: auto` chose on this CPU, and why, beside them.
The variants run one after another in one session: compare them with each other, not across days.
Writes benchmarks/results/cpu-plan.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from pipelines.config import ExperimentConfig, load_config
from pipelines.runner import run_pipeline
from recsys.runtime.device import native_cpu_bf16


@dataclass(frozen=True)
class Settings:
    experiment: str
    epochs: int = 2
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> {precision, threads}

    def config(self, variant: dict[str, Any], work: Path) -> ExperimentConfig:
        overrides = {"train.schedule.epochs": self.epochs, "train.schedule.patience": self.epochs,
                     "train.hardware.device": "cpu", "train.progress": False, "tracking.enabled": False,
                     **{f"train.hardware.{key}": value for key, value in variant.items()}}  # fmt: skip
        return load_config(REPO / self.experiment, overrides)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    for variant in settings.variants.values():
        settings.config(variant, Path("."))  # every variant must load
    return settings


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/cpu-plan.yaml")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench-cpu-plan"))
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    rows = {}
    for label, variant in settings.variants.items():
        config = settings.config(variant, args.work_dir)
        outputs, _ = run_pipeline(config, args.work_dir, until="train_retriever", rerun=["train_retriever"])
        assert outputs.model is not None
        metrics = outputs.model.metrics
        rows[label] = {**variant, "seconds_per_epoch": significant(metrics["seconds_per_epoch"]),
                       "epochs": metrics["epochs_run"]}  # fmt: skip
    result = {
        "experiment": settings.experiment,
        "epochs": settings.epochs,
        "variants": rows,
        "auto": {"bf16": bool(native_cpu_bf16()), "native_bf16_flags": native_cpu_bf16(),
                 "default_threads": torch.get_num_threads()},
        **provenance(),
    }  # fmt: skip
    path = write_result("cpu-plan", result, args.results_dir, reproduce)
    print(rows, result["auto"], f"-> {path}", sep="\n")
    return path


if __name__ == "__main__":
    main()
