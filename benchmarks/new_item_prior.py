"""The new-item prior on the cold-start protocol: a logit offset for never-trained items, chosen on validation.

Usage:
    .venv/bin/python -m benchmarks.new_item_prior --set device=cuda   # benchmarks/configs/beauty-new-item-prior.yaml

The config names a comparisons config (`benchmarks.comparisons`: its models, seeds, work directory), the models of it
to analyse, the reference they are paired against, the offsets tried and the warm-quality tolerance. Every (model,
seed) is trained and evaluated by the pipeline as the comparisons train them (a run already in the work directory is
reused). Then, per run (`recsys.evaluation.new_item_prior`): every validation user's rank at each offset (the valid
curve: overall N@10, warm N@10, cold R@10 / R@50), the offset each rule picks on validation, and the test ranks at it:

    tolerance   the largest offset whose warm-user validation N@10 is within `warm_tolerance` of the offset-0 one's
    reference   the largest offset whose warm-user validation N@10 is within `warm_tolerance` of the reference's own
                (same seed): a model better than the reference on warm users spends that margin on new items
    overall     the offset of the best overall validation N@10

benchmarks/results/<result_name>.json: per model, per seed the valid curve, the chosen offsets and the test metrics
(overall, warm, cold) at each, their mean ± std over seeds, and per rule the paired test difference against the
reference on the same users (`pair_metrics`, slices as in the comparisons), pooled over the seeds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.comparisons import Settings as ComparisonSettings
from benchmarks.comparisons import analysed_comparisons, evaluated_runs, metric_difference, pooled_over_seeds
from recsys.artifacts.comparison import compare_ranks
from recsys.artifacts.model_dir import load_model_dir, read_metrics
from recsys.artifacts.per_user import PER_USER_FILE, PerUserRanks
from recsys.data.splits import TEST, VALID
from recsys.evaluation.metrics import ranking_metrics
from recsys.evaluation.new_item_prior import chosen_prior, ranks_with_priors
from recsys.evaluation.protocol import EvalConfig
from recsys.evaluation.slices import slice_families, slice_metrics
from recsys.evaluation.uncertainty import seed_summary

logger = logging.getLogger(__name__)
RULES = ("tolerance", "reference", "overall")
CURVE_METRICS = ("ndcg@10", "warm.ndcg@10", "cold.recall@10", "cold.recall@50")
KS = (5, 10, 50)


@dataclass(frozen=True)
class Settings:
    comparisons: str  # a comparisons config (a path in the repo): the models, seeds and work directory
    models: list[str]  # the labels analysed
    reference: str  # the label every analysed model is paired against (at its own scores: no offset)
    priors: list[float] = field(default_factory=lambda: [0.5 * step for step in range(21)])  # logit offsets, 0 first
    warm_tolerance: float = 0.02  # the share of warm validation N@10 the "tolerance" and "reference" rules may give up
    device: str = "cpu"  # training and scoring device
    # dotted overrides of the comparisons config (e.g. its work_dir, or the experiment overrides its runs were made
    # with), so that their runs are found up to date and reused
    comparisons_overrides: dict[str, Any] = field(default_factory=dict)
    result_name: str = "beauty-new-item-prior"
    pair_metrics: list[str] = field(
        default_factory=lambda: ["cold.recall@10", "cold.recall@50", "warm.ndcg@10", "ndcg@10"]
    )


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    if 0.0 not in settings.priors:
        raise SystemExit(f"priors {settings.priors} lack 0, the model's own scores. Fix: add 0.0")
    _comparisons(settings)
    return settings


def _comparisons(settings: Settings) -> ComparisonSettings:
    labels = [*settings.models, settings.reference]
    return analysed_comparisons(settings.comparisons, settings.device, settings.comparisons_overrides, labels)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/beauty-new-item-prior.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    comparisons = _comparisons(settings)
    references = [
        (PerUserRanks.read(outputs.evaluation.evaluation_dir / PER_USER_FILE), _warm_valid(outputs.model.model_dir))
        for outputs in evaluated_runs(comparisons, settings.reference)
    ]
    models = {}
    for label in settings.models:
        seeds = [
            _analysed(outputs.model.model_dir, *reference, settings, comparisons)
            for outputs, reference in zip(evaluated_runs(comparisons, label), references, strict=True)
        ]
        models[label] = {"per_seed": seeds, **_summaries(seeds, settings)}
    result = {"settings": {**settings.__dict__, "seeds": comparisons.seeds, "work_dir": comparisons.work_dir},
              "uncertainty": comparisons.uncertainty.to_dict(), "models": models, **provenance()}  # fmt: skip
    path = write_result(settings.result_name, result, args.results_dir, reproduce)
    for label, record in models.items():
        for rule in RULES:
            test = record["test"][rule]
            figures = ", ".join(f"{m} {test[m]['mean']:.4f} ± {test[m]['std']:.4f}" for m in settings.pair_metrics)
            print(f"{label}, offset by {rule} (valid): prior {record['prior'][rule]['mean']:.2f}; test {figures}")
    print(f"-> {path}")
    return path


def _warm_valid(model_dir: Path) -> float:
    """A trained model's validation N@10 on warm users (every user where the data has no new items)."""
    metrics = read_metrics(model_dir)
    return float(metrics.get("valid_warm", metrics["valid"])["ndcg@10"])


def _analysed(
    model_dir: Path,
    reference: PerUserRanks,
    reference_warm: float,
    settings: Settings,
    comparisons: ComparisonSettings,
) -> dict[str, Any]:
    """One run: its validation curve over the offsets, each rule's offset (the reference rule's against
    `reference_warm`, the reference's warm validation N@10), and the test metrics and paired differences against the
    reference's test ranks at it."""
    trained = load_model_dir(model_dir)
    model, data = trained.model.to(settings.device).eval(), trained.data
    new_items = data.item_counts() == 0
    new_items[0] = False
    config = EvalConfig(ks=KS)
    valid = data.eval_split(VALID)
    valid_ranks = ranks_with_priors(model, valid, new_items, settings.priors, config)
    curve = [_metrics(ranks, new_items[valid.targets]) for ranks in valid_ranks]
    warm = [m["warm.ndcg@10"] for m in curve]
    chosen = {
        "tolerance": chosen_prior(settings.priors, warm, settings.warm_tolerance),
        "reference": chosen_prior(settings.priors, warm, settings.warm_tolerance, baseline=reference_warm),
        "overall": settings.priors[max(range(len(curve)), key=lambda p: curve[p]["ndcg@10"])],
    }
    test = data.eval_split(TEST)
    tested = sorted(set(chosen.values()))
    at = dict(zip(tested, ranks_with_priors(model, test, new_items, tested, config), strict=True))
    families = slice_families(data, test)
    valid_curve = [{"prior": prior, **metrics} for prior, metrics in zip(settings.priors, curve, strict=True)]
    record: dict[str, Any] = {"model_dir": str(model_dir), "valid": valid_curve, "prior": chosen}
    record["reference_valid_warm_ndcg@10"] = reference_warm
    record.update(test={}, pairs={})
    for rule, prior in chosen.items():
        record["test"][rule] = _metrics(at[prior], new_items[test.targets])
        challenger = PerUserRanks.of(at[prior], test, families)
        comparison = compare_ranks(challenger, reference, (model_dir.name, "reference"), KS, comparisons.uncertainty)
        record["pairs"][rule] = {metric: metric_difference(comparison, metric) for metric in settings.pair_metrics}
    logger.info("%s: offsets chosen on validation %s", model_dir.name, chosen)
    return record


def _metrics(ranks: torch.Tensor, cold_targets: torch.Tensor) -> dict[str, float]:
    """Overall N@10 / R@10 and the warm and cold users' metrics of one split's (U,) ranks, flat ("cold.recall@10")."""
    overall = ranking_metrics(ranks, KS)
    metrics = {"ndcg@10": overall["ndcg@10"], "recall@10": overall["recall@10"]}
    for name, members in (("warm", ~cold_targets), ("cold", cold_targets)):
        sliced = slice_metrics(ranks, members, KS)
        metrics.update({f"{name}.{m}": sliced.get(m, 0.0) for m in ("ndcg@10", "recall@10", "recall@50")})
    return metrics


def _summaries(seeds: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
    """Per rule: the offset and every test metric as mean ± std over the seeds; the pooled paired differences."""
    return {
        "prior": {rule: seed_summary([s["prior"][rule] for s in seeds]) for rule in RULES},
        "test": {
            rule: {m: seed_summary([s["test"][rule][m] for s in seeds]) for m in seeds[0]["test"][rule]}
            for rule in RULES
        },
        "pairs": {
            rule: {m: pooled_over_seeds([s["pairs"][rule][m] for s in seeds]) for m in settings.pair_metrics}
            for rule in RULES
        },
    }


if __name__ == "__main__":
    main()
