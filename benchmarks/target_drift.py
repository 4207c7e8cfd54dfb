"""How popular in training the training, the validation and the test targets were: the share of each one's targets in
each popularity decile of the items' training counts (`recsys.evaluation.slices.popularity_deciles`, decile 1 the least
popular), their median and mean training count and the share never trained on. Under leave-one-out the test target
comes one interaction later than the validation one; where it was less popular in training, a model that leans on
what was popular there gains more on validation than on test (docs/semantic_ids.md).

Usage:
    .venv/bin/python -m benchmarks.target_drift     # benchmarks/configs/target-drift.yaml: Beauty and Sports

The config lists data sets (`data`: a label, an experiment config whose data section is read, the raw data's path);
each is prepared by the pipeline's prepare step in `work_dir` (kept when up to date). Writes
benchmarks/results/<result_name>.json: per data set and split (training, valid, test) the decile shares, the training
counts of the targets and their number; per data set the shift of each decile's share from validation to test.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.quality import work_overrides
from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.data.prepared import SequenceData, load_prepared
from recsys.data.splits import TEST, VALID
from recsys.evaluation.slices import NUM_DECILES, popularity_deciles

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataSet:
    label: str
    config: str  # an experiment config in the repo: its data section says how the data is read
    data_path: str | None = None  # the raw data (its data.path); None: the config's own (e.g. a generated source)


@dataclass(frozen=True)
class Settings:
    """What the benchmark reads (benchmarks/configs/target-drift.yaml)."""

    data: list[DataSet]
    result_name: str = "target-drift"
    work_dir: str = ".cache/bench-target-drift"


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


TRAINING = "training"  # the targets training predicts: every training item but each user's first


def target_popularity(targets: torch.Tensor, counts: torch.Tensor) -> dict[str, Any]:
    """How popular in training `targets` (item_idx) were: decile shares, median and mean training count, the share
    never trained on, and how many there are."""
    deciles = popularity_deciles(counts)[targets]
    target_counts = counts[targets].double()
    return {
        "targets": len(targets),
        "decile_shares": {str(d): float((deciles == d).double().mean()) for d in range(1, NUM_DECILES + 1)},
        "median_training_count": float(target_counts.median()),
        "mean_training_count": float(target_counts.mean()),
        "never_trained_share": float((target_counts == 0).double().mean()),
    }


def training_targets(data: SequenceData) -> torch.Tensor:
    """(N,) the items training predicts: every row's items but its first."""
    items = data.training_rows().items
    first = torch.zeros(len(items.values), dtype=torch.bool)
    first[items.offsets[:-1][items.lengths() > 0]] = True
    return items.values[~first]


def data_set_drift(data: SequenceData) -> dict[str, Any]:
    """The target popularity of training, validation and test, and each decile's share on test minus on validation.
    A training target's count includes itself; validation's and test's are never counted."""
    counts = data.item_counts()  # (V+1,)
    splits = {split: target_popularity(data.eval_split(split).targets, counts) for split in (VALID, TEST)}
    valid, test = splits[VALID]["decile_shares"], splits[TEST]["decile_shares"]
    return {
        TRAINING: target_popularity(training_targets(data), counts),
        **splits,
        "test_minus_valid_shares": {d: test[d] - valid[d] for d in valid},
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/target-drift.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    work = (REPO / settings.work_dir).resolve()
    result: dict[str, Any] = {"data": {}, **provenance()}
    for entry in settings.data:
        where = work / entry.label
        data_path = {} if entry.data_path is None else {"data.path": entry.data_path}
        config = load_config(REPO / entry.config, {**data_path, **work_overrides(where)})
        outputs, _ = run_pipeline(config, where, until="prepare_data")
        assert outputs.data is not None
        drift = data_set_drift(load_prepared(outputs.data.data_dir))
        result["data"][entry.label] = {"config": entry.config, "data_path": entry.data_path, **drift}
        logger.info(
            "%s: median training count of the targets %.0f on validation, %.0f on test",
            entry.label, drift[VALID]["median_training_count"], drift[TEST]["median_training_count"],
        )  # fmt: skip
    path = write_result(settings.result_name, result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
