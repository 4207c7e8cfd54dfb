"""The generative retriever's popularity correction (`model.params.popularity_correction`, docs/semantic_ids.md)
chosen on validation without training again, and its test figures paired against a reference.

Usage:
    .venv/bin/python -m benchmarks.generative_popularity --set device=cuda   # beauty-generative-popularity.yaml

The config names a comparisons config (`benchmarks.comparisons`: its models, seeds and work directory), the label of
a generative model in it trained without the correction, the reference it is paired against and the alphas tried.
Every (model, seed) is trained and evaluated as the comparisons train them (a run already in the work directory is
reused). Then, per seed, the trained model ranks the validation users at every alpha
(`GenerativeRetriever.with_popularity_correction`: the same weights) and the alpha of the best validation N@10 ranks
the test users, paired on the same users against the reference's test ranks; alpha 0 (the model as trained) is
always tried, so the result also holds the model's own figures.

benchmarks/results/<result_name>.json: per seed the validation curve (N@10, R@10, coverage@10 per alpha), the chosen
alpha and the test metrics and paired differences at it and at 0; their mean ± std over the seeds and the pooled
paired differences.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.comparisons import Settings as ComparisonSettings
from benchmarks.comparisons import analysed_comparisons, evaluated_runs, metric_difference, pooled_over_seeds
from recsys.artifacts.comparison import compare_ranks
from recsys.artifacts.model_dir import load_model_dir
from recsys.artifacts.per_user import PER_USER_FILE, PerUserRanks
from recsys.data.splits import TEST, VALID
from recsys.evaluation.protocol import EvalConfig, evaluate
from recsys.evaluation.slices import slice_families
from recsys.evaluation.uncertainty import seed_summary
from recsys.models.generative import GenerativeRetriever

logger = logging.getLogger(__name__)
KS = (5, 10)
CURVE_METRICS = ("ndcg@10", "recall@10", "coverage@10")
AT = ("chosen", "none")  # the test figures at the validation-chosen alpha and at alpha 0


@dataclass(frozen=True)
class Settings:
    comparisons: str  # a comparisons config (a path in the repo): the models, seeds and work directory
    model: str  # the label of the generative model (trained with popularity_correction 0)
    reference: str  # the label it is paired against
    alphas: list[float] = field(default_factory=lambda: [0.0, 0.125, 0.25, 0.5, 0.75, 1.0])
    device: str = "cpu"
    comparisons_overrides: dict[str, Any] = field(default_factory=dict)  # so that its runs are found up to date
    result_name: str = "beauty-generative-popularity"
    pair_metrics: list[str] = field(default_factory=lambda: ["ndcg@10", "recall@10"])


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    if 0.0 not in settings.alphas or min(settings.alphas) < 0:
        raise SystemExit(f"alphas {settings.alphas}: give values >= 0, 0 (the model as trained) among them")
    _comparisons(settings)
    return settings


def _comparisons(settings: Settings) -> ComparisonSettings:
    labels = [settings.model, settings.reference]
    return analysed_comparisons(settings.comparisons, settings.device, settings.comparisons_overrides, labels)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/beauty-generative-popularity.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    comparisons = _comparisons(settings)
    references = [
        PerUserRanks.read(outputs.evaluation.evaluation_dir / PER_USER_FILE)
        for outputs in evaluated_runs(comparisons, settings.reference)
    ]
    seeds = [
        _swept(outputs.model.model_dir, reference, settings, comparisons)
        for outputs, reference in zip(evaluated_runs(comparisons, settings.model), references, strict=True)
    ]
    summary = {
        "alpha": seed_summary([s["alpha"] for s in seeds]),
        "test": {at: {m: seed_summary([s["test"][at][m] for s in seeds]) for m in CURVE_METRICS} for at in AT},
        "pairs": {
            at: {m: pooled_over_seeds([s["pairs"][at][m] for s in seeds]) for m in settings.pair_metrics} for at in AT
        },
    }
    result = {
        "settings": {**settings.__dict__, "seeds": comparisons.seeds, "work_dir": comparisons.work_dir},
        "uncertainty": comparisons.uncertainty.to_dict(),
        "per_seed": seeds,
        **summary,
        **provenance(),
    }
    path = write_result(settings.result_name, result, args.results_dir, reproduce)
    for at, where in zip(AT, ("at the alpha chosen on validation", "as trained (alpha 0)"), strict=True):
        figures = ", ".join(f"{m} {v['mean']:+.4f}" for m, v in summary["pairs"][at].items())
        print(f"{settings.model} - {settings.reference}, {where}: {figures}")
    print(f"alpha chosen on validation: {summary['alpha']['mean']:.3f} ± {summary['alpha']['std']:.3f}\n-> {path}")
    return path


def _swept(
    model_dir: Path, reference: PerUserRanks, settings: Settings, comparisons: ComparisonSettings
) -> dict[str, Any]:
    """One seed: validation at every alpha, the best one's and alpha 0's test metrics and pairs with the reference."""
    trained = load_model_dir(model_dir)
    model, data = trained.model.to(settings.device).eval(), trained.data
    if not isinstance(model, GenerativeRetriever) or model.config.popularity_correction:
        raise SystemExit(f"{model_dir}: give a generative model trained with popularity_correction 0")
    counts, config = data.item_counts(), EvalConfig(ks=KS)
    valid, test = data.eval_split(VALID), data.eval_split(TEST)
    curve = []
    for alpha in settings.alphas:
        scorer = model.with_popularity_correction(alpha, counts)
        metrics = evaluate(scorer, valid, data.num_items, config, what=f"validation at alpha {alpha}").metrics
        curve.append({"alpha": alpha, **{m: metrics[m] for m in CURVE_METRICS}})
    chosen = max(curve, key=lambda point: point["ndcg@10"])["alpha"]
    families = slice_families(data, test)
    record: dict[str, Any] = {"model_dir": str(model_dir), "valid": curve, "alpha": chosen, "test": {}, "pairs": {}}
    tested = {alpha: evaluate(model.with_popularity_correction(alpha, counts), test, data.num_items, config,
                              what=f"test at alpha {alpha}") for alpha in {chosen, 0.0}}  # fmt: skip
    for at, alpha in zip(AT, (chosen, 0.0), strict=True):
        result = tested[alpha]
        record["test"][at] = {m: result.metrics[m] for m in CURVE_METRICS}
        comparison = compare_ranks(PerUserRanks.of(result.ranks, test, families), reference,
                                   (model_dir.name, "reference"), KS, comparisons.uncertainty)  # fmt: skip
        record["pairs"][at] = {metric: metric_difference(comparison, metric) for metric in settings.pair_metrics}
    logger.info("%s: alpha %s chosen on validation", model_dir.name, chosen)
    return record


if __name__ == "__main__":
    main()
