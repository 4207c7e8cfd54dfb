"""The generative retriever's decoding settings chosen on validation without training again: its popularity
correction (`model.params.popularity_correction`) and, with the retrieval head, the weight of that head's score
(`model.params.retrieval_weight`) and the number of its candidates (`retrieval_candidates`; docs/semantic_ids.md); the
test figures paired against a reference.

Usage:
    .venv/bin/python -m benchmarks.generative_decoding --set device=cuda   # beauty-generative-popularity.yaml
    .venv/bin/python -m benchmarks.generative_decoding --set device=cuda \
        --config benchmarks/configs/beauty-generative-retrieval-decoding.yaml

The config names a comparisons config (`benchmarks.comparisons`: its models, seeds and work directory), the label of
a generative model in it trained without the correction, the reference it is paired against, the alphas tried and
the retrieval weights and candidates tried (none: the model's own). Every (model, seed) is trained and evaluated as
the comparisons train them (a run already in the work directory is reused). Then, per seed, the trained model ranks
the validation users at every combination (`GenerativeRetriever.with_decoding`: the same weights) and the one of
the best validation N@10 ranks the test users, paired on the same users against the reference's test ranks; the model as
trained (alpha 0, its own retrieval settings) is always tried, so the result also holds the model's own figures.

benchmarks/results/<result_name>.json: per seed the validation grid (N@10, R@10, coverage@10 per setting), the chosen
setting and the test metrics and paired differences at it and as trained; their mean ± std over the seeds and the
pooled paired differences.
"""

from __future__ import annotations

import itertools
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
SETTINGS = ("popularity_correction", "retrieval_weight", "retrieval_candidates")  # swept (`with_decoding`)
CURVE_METRICS = ("ndcg@10", "recall@10", "coverage@10")
AT = ("chosen", "as_trained")  # the test figures at the validation-chosen setting and at the trained one


@dataclass(frozen=True)
class Settings:
    comparisons: str  # a comparisons config (a path in the repo): the models, seeds and work directory
    model: str  # the label of the generative model (trained with popularity_correction 0)
    reference: str  # the label it is paired against
    alphas: list[float] = field(default_factory=lambda: [0.0, 0.125, 0.25, 0.5, 0.75, 1.0])
    # the retrieval head's weights and numbers of candidates tried besides the model's own (a model with the head)
    retrieval_weights: list[float] = field(default_factory=list)
    retrieval_candidates: list[int] = field(default_factory=list)
    device: str = "cpu"
    comparisons_overrides: dict[str, Any] = field(default_factory=dict)  # so that its runs are found up to date
    result_name: str = "beauty-generative-popularity"
    pair_metrics: list[str] = field(default_factory=lambda: ["ndcg@10", "recall@10"])


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    if 0.0 not in settings.alphas or min(settings.alphas) < 0:
        raise SystemExit(f"alphas {settings.alphas}: give values >= 0, 0 (the model as trained) among them")
    if min(settings.retrieval_weights, default=0.0) < 0:
        raise SystemExit(f"retrieval_weights {settings.retrieval_weights}: give values >= 0")
    if min(settings.retrieval_candidates, default=1) < 1:
        raise SystemExit(f"retrieval_candidates {settings.retrieval_candidates}: give values >= 1")
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
        **{name: seed_summary([s["chosen"][name] for s in seeds]) for name in SETTINGS},
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
    for at, where in zip(AT, ("at the setting chosen on validation", "as trained"), strict=True):
        figures = ", ".join(f"{m} {v['mean']:+.4f}" for m, v in summary["pairs"][at].items())
        print(f"{settings.model} - {settings.reference}, {where}: {figures}")
    chosen = ", ".join(f"{name} {summary[name]['mean']:.3f} ± {summary[name]['std']:.3f}" for name in SETTINGS)
    print(f"chosen on validation: {chosen}\n-> {path}")
    return path


def _swept(
    model_dir: Path, reference: PerUserRanks, settings: Settings, comparisons: ComparisonSettings
) -> dict[str, Any]:
    """One seed: validation at every setting, the best one's and the trained one's test metrics and pairs with the
    reference."""
    trained = load_model_dir(model_dir)
    model, data = trained.model.to(settings.device).eval(), trained.data
    if not isinstance(model, GenerativeRetriever) or model.config.popularity_correction:
        raise SystemExit(f"{model_dir}: give a generative model trained with popularity_correction 0")
    if (settings.retrieval_weights or settings.retrieval_candidates) and not model.retrieves:
        raise SystemExit(f"{model_dir}: retrieval_weights and retrieval_candidates need a model trained with the "
                         "retrieval head (model.params.retrieval_candidates > 0); drop them to sweep alpha "
                         "alone")  # fmt: skip
    as_trained = {name: getattr(model.config, name) for name in SETTINGS}  # its popularity_correction: 0
    weights = sorted({*settings.retrieval_weights, as_trained["retrieval_weight"]})
    candidates = sorted({*settings.retrieval_candidates, as_trained["retrieval_candidates"]})
    grid = [
        dict(zip(SETTINGS, values, strict=True)) for values in itertools.product(settings.alphas, weights, candidates)
    ]
    counts, config = data.item_counts(), EvalConfig(ks=KS)
    valid, test = data.eval_split(VALID), data.eval_split(TEST)
    curve = []
    for setting in grid:
        metrics = evaluate(model.with_decoding(counts, **setting), valid, data.num_items, config,
                           what=f"validation at {_named(setting)}").metrics  # fmt: skip
        curve.append({**setting, **{m: metrics[m] for m in CURVE_METRICS}})
    best = max(curve, key=lambda point: point["ndcg@10"])
    chosen = {name: best[name] for name in SETTINGS}
    families = slice_families(data, test)
    record: dict[str, Any] = {"model_dir": str(model_dir), "valid": curve, "chosen": chosen, "as_trained": as_trained,
                              "test": {}, "pairs": {}}  # fmt: skip
    tested = {  # the chosen setting may be the trained one: tested once
        _named(setting): evaluate(
            model.with_decoding(counts, **setting), test, data.num_items, config, what=f"test at {_named(setting)}"
        )
        for setting in (chosen, as_trained)
    }
    for at, setting in zip(AT, (chosen, as_trained), strict=True):
        result = tested[_named(setting)]
        record["test"][at] = {m: result.metrics[m] for m in CURVE_METRICS}
        comparison = compare_ranks(PerUserRanks.of(result.ranks, test, families), reference,
                                   (model_dir.name, "reference"), KS, comparisons.uncertainty)  # fmt: skip
        record["pairs"][at] = {metric: metric_difference(comparison, metric) for metric in settings.pair_metrics}
    logger.info("%s: %s chosen on validation", model_dir.name, _named(chosen))
    return record


def _named(setting: dict[str, float]) -> str:
    return ", ".join(f"{name} {value}" for name, value in setting.items())


if __name__ == "__main__":
    main()
