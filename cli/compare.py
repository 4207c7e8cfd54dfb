"""`recsys evaluate --compare OTHER_MODEL_DIR`: two trained models on the same users, metric by metric, paired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.render import comparison_table, print_tables

if TYPE_CHECKING:
    from recsys.artifacts.model_dir import TrainedModel
    from recsys.evaluation import EvalResult


def compare_models(
    this: tuple[Path, TrainedModel, EvalResult], other_dir: Path, data_dir: Path | None, split: str
) -> None:
    """Evaluate the model of `other_dir` as `this` (model dir, model, result) was evaluated (the same split, settings
    and user sample; on `data_dir` or its own training data), compare the two per user (`recsys.artifacts.comparison`),
    print the table and write the comparison beside this model directory: NAME.vs-OTHER.SPLIT.json."""
    from recsys.artifacts.comparison import compare_ranks
    from recsys.artifacts.model_dir import load_model_dir, trained_config_name
    from recsys.artifacts.per_user import PerUserRanks
    from recsys.evaluation import evaluate
    from recsys.evaluation.slices import slice_families
    from recsys.runtime.atomic import atomic_file

    model_dir, trained, result = this
    other = load_model_dir(other_dir, data_dir)
    mine, theirs = trained.data.eval_split(split), other.data.eval_split(split)
    what = f"evaluation of {other_dir} on {split}"
    other_result = evaluate(other.model, theirs, other.data.num_items, result.config, result.sample, what=what)
    rows = None if result.sample is None else result.sample.rows(len(mine.targets))
    names = (trained_config_name(model_dir), trained_config_name(other_dir))
    if names[0] == names[1]:  # two runs of one config: told apart by their directories
        names = (str(model_dir), str(other_dir))
    comparison = compare_ranks(
        PerUserRanks.of(result.ranks, mine, slice_families(trained.data, mine), rows),
        PerUserRanks.of(other_result.ranks, theirs, rows=rows),
        names,
        result.config.ks,
        result.config.uncertainty,
    )
    sample = None if result.sample is None else {"users": len(result.ranks), "seed": result.sample.seed}
    comparison |= {"split": split, "sample": sample}
    path = model_dir.parent / f"{model_dir.name}.vs-{other_dir.name}.{split}.json"
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(comparison, indent=2) + "\n")
    title = f"{names[0]} vs {names[1]} on {split}, {len(result.ranks):,} users" + (
        f" (a SAMPLE, seed {result.sample.seed}, not the full protocol)" if result.sample is not None else ""
    )
    print_tables(comparison_table(title, comparison, {names[0]: result.metrics, names[1]: other_result.metrics}))
    typer.echo(f"comparison: {path}")
