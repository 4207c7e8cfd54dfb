"""Comparisons with intervals: several experiment configs, several seeds each, every pair's paired test; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.comparisons                                   # Beauty: SASRec, + SID, two-stage
    .venv/bin/python -m benchmarks.comparisons --set device=cuda                 # the same on a GPU
    .venv/bin/python -m benchmarks.comparisons --config benchmarks/configs/comparisons-smoke.yaml  # seconds, synthetic
    .venv/bin/python -m benchmarks.comparisons --only-seed 2    # one seed's runs, beside others in parallel; then the
                                                               # command without it gathers them (nothing retrained)
    .venv/bin/python -m benchmarks.comparisons --only-seed 2 --only-model SASRec   # one run: one process per run
    .venv/bin/python -m benchmarks.comparisons --side-by-side 4   # every (model, seed) in a process of its own, 4 at
                                                                 # a time (logs in the work dir), then gathered

The config (benchmarks/configs/beauty-comparisons.yaml) names the models (a label and an experiment config each; a
ranker names the models it is built on, `retriever` and `holdout_retriever` (and `extra_retrievers` /
`extra_holdout_retrievers`, lists, for its model candidate sources), a distilled student its `teacher`, and
each gets their runs of the same seed),
the seeds, the device, the work directory and the intervals' settings. Every (model, seed) is trained and evaluated on
test by the pipeline (`benchmarks.quality.train_seeds`: train.seed = the config's + i, until the `evaluate` step,
which keeps every test user's rank): a (model, seed) already up to date in the work directory is skipped, so the
benchmark resumes where it stopped. benchmarks/results/<result_name>.json then gives:

    models   per model and metric of `model_metrics` (test N@10 and R@10 by default; `cold.recall@10` is test R@10
             on the users of slice "cold", `valid_cold.recall@10` the same on validation, from the model directory's
             metrics.json, as its timings: `train.seconds_per_epoch`, `train.time_to_first_step_s`): each seed's
             value (test ones with their bootstrap interval) and mean ± std over the seeds
    pairs    per pair of models (a minus b; with `pairs_with`, each model minus that one), per metric of
             `pair_metrics` (N@10 by default, slices as above) and per seed: the paired difference on the same test
             users, its interval and p-value (`recsys.evaluation.uncertainty`); pooled: the mean difference over the
             seeds ± its std, and in how many seeds the interval excludes 0 either way
             and, for a model with tasks beside ranking (`recsys.evaluation.evaluate_tasks`), each task's measures
             (accuracy and its no-model baselines, AUC, RMSE) the same way under "tasks"
    search_pairs  the same for two models that read queries, on search N@10 per query level and setting (each seed
             on the users both ranked there)
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, write_result
from benchmarks.quality import seeded, train_seeds, work_overrides
from benchmarks.side_by_side import Unit, run_side_by_side, visible_gpus
from pipelines.config import ExperimentConfig, load_config
from pipelines.steps import PipelineOutputs
from recsys.artifacts.comparison import compare_evaluation_dirs, compare_search_dirs
from recsys.artifacts.evaluation_dir import EVALUATION_FILE
from recsys.artifacts.model_dir import METRICS_FILE
from recsys.evaluation.uncertainty import Uncertainty, seed_summary

logger = logging.getLogger(__name__)
VALIDATION = "valid"  # a model metric "valid[_slice].metric" is read from the model directory's metrics.json
TRAINING = "train"  # and "train.<timing>" (seconds_per_epoch, time_to_first_step_s, ...): how its training went
SEARCH_METRIC = "ndcg@10"  # per search level and setting, of a model that reads queries


@dataclass(frozen=True)
class Model:
    label: str  # how the result names it, e.g. "SASRec + SID features"
    config: str  # its experiment config, a path in the repo
    # the label of the model whose run (of the same seed) is its model.upstream.retriever
    retriever: str | None = None
    # the same for model.upstream.holdout_retriever (a ranker's held-out first stage)
    holdout_retriever: str | None = None
    teacher: str | None = None  # the same for distill.teacher_dir (a distilled student's teacher)
    # the same, in order, for model.upstream.extra_retrievers and extra_holdout_retrievers (a ranker's model sources)
    extra_retrievers: list[str] = field(default_factory=list)
    extra_holdout_retrievers: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted, of this model's config only

    def upstream(self) -> list[str]:
        """The labels of the models it is built on."""
        single = [label for label in (self.retriever, self.holdout_retriever, self.teacher) if label is not None]
        return [*single, *self.extra_retrievers, *self.extra_holdout_retrievers]


@dataclass(frozen=True)
class Settings:
    models: list[Model]
    seeds: int = 3  # runs per model: train.seed = the config's + 0..seeds-1
    device: str = "cpu"  # train.device of every run (cuda on a GPU)
    work_dir: str = ".cache/bench-comparisons"  # prepared data, models, evaluations, MLflow; what is there is reused
    result_name: str = "beauty-comparisons"
    experiment: dict[str, Any] = field(default_factory=dict)  # dotted overrides of every model's config
    uncertainty: Uncertainty = field(default_factory=Uncertainty)
    pair_metrics: list[str] = field(default_factory=lambda: ["ndcg@10"])  # "metric" or "slice.metric"
    model_metrics: list[str] = field(default_factory=lambda: ["ndcg@10", "recall@10"])  # as pair_metrics, + "valid*."
    pairs_with: str | None = None  # a model's label: pair every other model with it alone (None: every pair)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    labels = [model.label for model in settings.models]
    for model in settings.models:
        for upstream in model.upstream():
            if upstream not in labels or labels.index(upstream) >= labels.index(model.label):
                raise SystemExit(f"{model.label}: the model it is built on, {upstream!r}, must be listed before it")
        model_config(settings, model, 0, REPO / settings.work_dir)  # every config must load
    return settings


def model_config(settings: Settings, model: Model, offset: int, work: Path) -> ExperimentConfig:
    """The experiment config of `model`'s run `offset` (its retriever, held-out retriever and teacher: those models'
    runs of the same offset)."""
    own = {"train.hardware.device": settings.device, "eval.uncertainty": asdict(settings.uncertainty)}
    overrides = {**work_overrides(work), **own, **settings.experiment, **model.overrides}
    for key, label in (
        ("model.upstream.retriever", model.retriever),
        ("model.upstream.holdout_retriever", model.holdout_retriever),
        ("distill.teacher_dir", model.teacher),
    ):
        if label is not None:
            overrides[key] = str(_model_dir(settings, label, offset, work))
    for key, labels in (
        ("model.upstream.extra_retrievers", model.extra_retrievers),
        ("model.upstream.extra_holdout_retrievers", model.extra_holdout_retrievers),
    ):
        if labels:
            overrides[key] = [str(_model_dir(settings, label, offset, work)) for label in labels]
    return seeded(load_config(REPO / model.config, overrides), offset)


def analysed_comparisons(
    path: str, device: str, overrides: dict[str, Any], labels: Sequence[str]
) -> Settings:  # fmt: skip
    """The comparisons config at `path` (a file in the repo) that another benchmark analyses, on `device` with
    `overrides`; SystemExit saying the fix when it is not in the repo or lacks a model of `labels`."""
    config = (REPO / path).resolve()
    if not config.is_relative_to(REPO) or not config.is_file():
        raise SystemExit(f"comparisons {path} is not a file in the repo. Fix: a comparisons config under "
                         "benchmarks/configs/")  # fmt: skip
    settings = load_settings(config, {"device": device, **overrides})
    known = [m.label for m in settings.models]
    for label in labels:
        if label not in known:
            raise SystemExit(f"{label!r} is not a model of {path}. Fix: one of {known}")
    return settings


def evaluated_runs(settings: Settings, label: str) -> list[PipelineOutputs]:
    """Every seed's run of the model `label`, trained and evaluated as the comparisons do (reused where up to date)."""
    work = (REPO / settings.work_dir).resolve()
    model = next(m for m in settings.models if m.label == label)
    return [
        train_seeds(model_config(settings, model, offset, work), work, 1, "evaluate", [])[0]
        for offset in range(settings.seeds)
    ]


def _model_dir(settings: Settings, label: str, offset: int, work: Path) -> Path:
    """The model directory of the run `offset` of the model labelled `label`."""
    upstream = next(m for m in settings.models if m.label == label)
    return work / "models" / model_config(settings, upstream, offset, work).name


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/beauty-comparisons.yaml")
    parser.add_argument("--only-seed", type=int, metavar="I", help="train and evaluate only run I (0..seeds-1) of "
                        "every model, and write no result: seeds run side by side in processes (or hosts sharing the "
                        "work dir) of their own; the command without it then gathers them")  # fmt: skip
    parser.add_argument(
        "--only-model",
        metavar="LABEL",
        help="train and evaluate only the runs of this model (and of the models it is built on), and write no "
        "result; with --only-seed, one run",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="side-by-side runs share the models they are built on: queue this long behind another process "
        "training one of them, then fail naming it (default: %(default)s; 0: fail at once)",
    )
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=1,
        metavar="N",
        help="train the runs in N processes at once, one (model, seed) each with its share of the cores and its log "
        "under WORK_DIR/logs, appended to by a resumed run (what --only-model L --only-seed I in N shells does), then "
        "gather them (default: %(default)s, in this process). With device cuda on several GPUs, each process runs on "
        "the one running the fewest. Stopped, the same command resumes",
    )
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    work = (REPO / settings.work_dir).resolve()
    seeds = range(settings.seeds) if args.only_seed is None else [args.only_seed]
    if args.only_seed is not None and not 0 <= args.only_seed < settings.seeds:
        raise SystemExit(f"--only-seed {args.only_seed}: the config has seeds 0..{settings.seeds - 1}")
    chosen = settings.models if args.only_model is None else built_on(settings.models, args.only_model)
    if args.side_by_side != 1:
        labels = [model.label for model in settings.models] if args.only_model is None else [args.only_model]
        own = sys.argv[1:] if argv is None else argv  # each process's own options come after, and win
        gpus = visible_gpus() if settings.device == "cuda" else []  # several: each process on the least busy one
        run_side_by_side(side_by_side_units(settings, seeds, labels, [sys.executable, "-m", reproduce.benchmark, *own],
                                            work), args.side_by_side, gpus)  # fmt: skip
    if args.only_seed is not None or args.only_model is not None:
        for offset, model in itertools.product(seeds, chosen):  # a retriever's run of a seed before its ranker's
            train_seeds(model_config(settings, model, offset, work), work, 1, "evaluate", [], args.wait)
        print(f"runs {list(seeds)} of {[model.label for model in chosen]} trained and evaluated in {work}")
        return work
    labels = [model.label for model in settings.models]
    if settings.pairs_with is not None and settings.pairs_with not in labels:
        raise SystemExit(f"pairs_with {settings.pairs_with!r} is not a model of the config. Fix: one of {labels}")
    evaluations: dict[str, list[Path]] = {}
    model_dirs: dict[str, list[Path]] = {}
    for model in settings.models:
        for offset in range(settings.seeds):  # the retriever's run of this seed exists before its ranker's
            (outputs,) = train_seeds(model_config(settings, model, offset, work), work, 1, "evaluate", [], args.wait)
            assert outputs.evaluation is not None and outputs.model is not None
            evaluations.setdefault(model.label, []).append(outputs.evaluation.evaluation_dir)
            model_dirs.setdefault(model.label, []).append(outputs.model.model_dir)
    models = {
        label: model_record(dirs, model_dirs[label], settings.model_metrics) for label, dirs in evaluations.items()
    }
    pairs = [(a, b) for a, b in itertools.combinations(evaluations, 2) if settings.pairs_with in (None, a, b)]
    pairs = [(b, a) if a == settings.pairs_with else (a, b) for a, b in pairs]  # each model minus the reference
    result = {
        "settings": {"seeds": settings.seeds, "device": settings.device, "work_dir": settings.work_dir,
                     "models": [asdict(m) for m in settings.models], "experiment": settings.experiment,
                     "pairs_with": settings.pairs_with},
        "uncertainty": settings.uncertainty.to_dict(),
        "models": models,
        "pairs": [record for a, b in pairs
                  for record in pair_records(a, b, settings.pair_metrics, evaluations, settings.uncertainty)],
        "search_pairs": [search_pair(a, b, evaluations, settings.uncertainty)
                         for a, b in itertools.combinations(evaluations, 2)
                         if "search" in models[a] and "search" in models[b]],
        **provenance(),
    }  # fmt: skip
    path = write_result(settings.result_name, result, args.results_dir, reproduce)
    for label, record in result["models"].items():
        figures = ", ".join(f"{m} {record[m]['mean']:.4f} ± {record[m]['std']:.4f}" for m in settings.model_metrics)
        print(f"{label} ({settings.seeds} seeds): {figures}")
    for pair in result["pairs"]:
        pooled = pair["pooled"]
        better = f"{pair['a']} in {pooled['seeds_a_better']}, {pair['b']} in {pooled['seeds_b_better']}"
        print(f"{pair['a']} - {pair['b']}: {pair['metric']} {pooled['mean']:+.4f} ± {pooled['std']:.4f}; better "
              f"beyond the interval: {better} of {pooled['seeds']} seeds")  # fmt: skip
    print(f"-> {path}")
    return path


def side_by_side_units(
    settings: Settings, seeds: Sequence[int], labels: list[str], command: list[str], work: Path
) -> list[Unit]:
    """One process per (seed, model label): `command` (this benchmark's, as given) with `--only-model LABEL
    --only-seed I --side-by-side 1` last, so that they win over the same options (or argparse's abbreviations of them)
    in `command`: a process never starts more. The models others are built on come first (theirs before them), each
    seed in turn: a ranker's process does not hold a place waiting for a retriever that no process is training yet."""
    runs = sorted(itertools.product(seeds, labels), key=lambda run: len(built_on(settings.models, run[1])))
    logs = _log_names(labels)
    return [
        Unit(f"{label} seed {offset}",
             [*command, "--only-model", label, "--only-seed", str(offset), "--side-by-side", "1"],
             work / "logs" / f"{logs[label]}-seed{offset}.log", group=label)
        for offset, label in runs
    ]  # fmt: skip


def _log_names(labels: list[str]) -> dict[str, str]:
    """Each label as a file name (`SASRec small` -> `sasrec-small`), labels that read the same numbered apart."""
    names: dict[str, str] = {}
    for label in labels:
        slug = name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "model"
        repeat = 1
        while name in names.values():
            repeat += 1
            name = f"{slug}-{repeat}"
        names[label] = name
    return names


def built_on(models: list[Model], label: str) -> list[Model]:
    """The model labelled `label`, after the models it is built on (theirs first)."""
    by_label = {model.label: model for model in models}
    if label not in by_label:
        raise SystemExit(f"--only-model {label!r} is not a model of the config. Fix: one of {list(by_label)}")
    model = by_label[label]
    upstream = {m.label: m for name in model.upstream() for m in built_on(models, name)}  # each once, in order
    return [*upstream.values(), model]


def model_record(evaluation_dirs: list[Path], model_dirs: list[Path], metrics: list[str]) -> dict[str, Any]:
    """Per metric of `metrics`: each seed's value (a test one with its interval), and the mean ± std over the seeds."""
    reports = [_read(directory) for directory in evaluation_dirs]
    trained = [json.loads((directory / METRICS_FILE).read_text()) for directory in model_dirs]
    record: dict[str, Any] = {"configs": [report["name"] for report in reports]}
    for metric in metrics:
        per_seed = [_model_value(report, run, metric) for report, run in zip(reports, trained, strict=True)]
        record[metric] = {**seed_summary([seed["value"] for seed in per_seed]), "per_seed": per_seed}
    searches = [search_metrics(report) for report in reports]
    if all(searches):  # a model that reads queries: the search protocol's N@10 per level and setting, over seeds
        record["search"] = {key: {**seed_summary([s[key] for s in searches]), "per_seed": [s[key] for s in searches]}
                            for key in searches[0]}  # fmt: skip
    tasks = [report.get("tasks") or {} for report in reports]
    if all(tasks):  # a model with tasks beside ranking (accuracy, AUC, ...)
        record["tasks"] = tasks_over_seeds(tasks)
    return record


def tasks_over_seeds(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """{task: {measure: mean ± std over the seeds, per_seed}} of each seed's `evaluate_tasks` report."""
    return {
        task: {
            measure: {**seed_summary(values := [seed[task][measure] for seed in per_seed]), "per_seed": values}
            for measure in measures
            if measure != "users"
        }
        for task, measures in per_seed[0].items()
    }


def _model_value(report: dict[str, Any], trained: dict[str, Any], metric: str) -> dict[str, Any]:
    """{"value"[, "interval"]} of `metric` in one seed's evaluation `report` (test, overall or "slice.metric") or its
    model directory's `trained` metrics ("valid.metric", "valid_cold.metric": what validation saw; "train.timing":
    its training's timings, of the attempt that finished it when a run was resumed)."""
    name, _, measure = metric.rpartition(".")
    if name == TRAINING:
        timings = sorted(key for key, value in trained.items() if isinstance(value, int | float))
        if measure not in timings:
            raise SystemExit(f"model metric {metric!r}: the model directory has no timing {measure!r}. Fix: one of "
                             f"{[f'{TRAINING}.{key}' for key in timings]}")  # fmt: skip
        return {"value": trained[measure]}
    if name.startswith(VALIDATION):
        if measure not in trained.get(name, {}):
            known = sorted(key for key in trained if key.startswith(VALIDATION))
            raise SystemExit(f"model metric {metric!r}: the model directory has no {name!r} {measure!r}. Fix: one of "
                             f"{known} (the cold slices need a cold-start split)")  # fmt: skip
        return {"value": trained[name][measure]}
    if not name:  # a list's measure (coverage@k) has no per-user values, so no interval
        interval = report["intervals"].get(measure)
        return {"value": report["overall"][measure], **({} if interval is None else {"interval": interval})}
    found = [entry for family in report["slices"].values() for entry in family if entry["name"] == name]
    if not found or measure not in found[0]:
        slices = sorted(entry["name"] for family in report["slices"].values() for entry in family)
        raise SystemExit(f"model metric {metric!r}: no slice {name!r} with {measure!r}. Fix: one of {slices}")
    return {"value": found[0][measure], "interval": found[0].get("intervals", {}).get(measure)}


def search_metrics(report: dict[str, Any], metric: str = SEARCH_METRIC) -> dict[str, float]:
    """{"<level>/<setting>": `metric`} of an evaluation's search block (empty for a model without one)."""
    search = report.get("search") or {}
    return {f"{level}/{setting}": next(iter(systems.values()))[metric]
            for level, settings in search.get("levels", {}).items() for setting, systems in settings.items()
            if systems}  # fmt: skip


def search_pair(a: str, b: str, evaluations: dict[str, list[Path]], uncertainty: Uncertainty) -> dict[str, Any]:
    """a minus b on search N@10 per level and setting, seed by seed on the users both ranked (paired intervals), and
    pooled over the seeds."""
    ks = _read(evaluations[a][0])["protocol"]["ks"]
    seeds = [compare_search_dirs(da, db, ks, uncertainty)
             for da, db in zip(evaluations[a], evaluations[b], strict=True)]  # fmt: skip
    levels = {}
    for key in seeds[0]:
        per_seed = [{**seed[key][SEARCH_METRIC], "users": seed[key]["users"]} for seed in seeds]
        levels[key] = {"per_seed": per_seed, "pooled": pooled_over_seeds(per_seed)}
    return {"a": a, "b": b, "metric": SEARCH_METRIC, "levels": levels}


def _read(evaluation_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((evaluation_dir / EVALUATION_FILE).read_text())
    return report


def pair_records(
    a: str, b: str, metrics: list[str], evaluations: dict[str, list[Path]], uncertainty: Uncertainty
) -> list[dict[str, Any]]:
    """a minus b on each test metric of `metrics` ("ndcg@10", or "cold.recall@10" on a slice's users), seed by seed
    on the same users, and pooled over the seeds: one record per metric. Each seed's pair is compared once, on only
    the slices the metrics name (the bootstraps are the gather's cost)."""
    slices = {name for metric in metrics if (name := metric.rpartition(".")[0])}
    comparisons = [compare_evaluation_dirs(dir_a, dir_b, uncertainty, slices)
                   for dir_a, dir_b in zip(evaluations[a], evaluations[b], strict=True)]  # fmt: skip
    records = []
    for metric in metrics:
        per_seed = [metric_difference(comparison, metric) for comparison in comparisons]
        records.append({"a": a, "b": b, "metric": metric, "per_seed": per_seed, "pooled": pooled_over_seeds(per_seed)})
    return records


def pooled_over_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """The seeds' paired differences pooled: mean ± std, and in how many seeds the interval excludes 0 either way."""
    return {
        **seed_summary([seed["difference"] for seed in per_seed]),
        "seeds_a_better": sum(seed["low"] > 0 for seed in per_seed),  # the interval above 0
        "seeds_b_better": sum(seed["high"] < 0 for seed in per_seed),
    }


def metric_difference(comparison: dict[str, Any], metric: str) -> dict[str, Any]:
    """The paired difference of `metric` in a `compare_evaluation_dirs` comparison (with its slice's user count)."""
    name, _, measure = metric.rpartition(".")
    if not name:
        return {**comparison["overall"][measure], "users": comparison["users"]}
    matches = [s for family in comparison["slices"].values() for s in family if s["slice"] == name]
    if not matches:
        slices = sorted(s["slice"] for family in comparison["slices"].values() for s in family)
        raise SystemExit(f"pair metric {metric!r}: no slice {name!r} in the evaluations. Fix: one of {slices}")
    found = matches[0]
    if not found["users"]:
        raise SystemExit(f"pair metric {metric!r}: slice {name!r} has no test users. Fix: compare another slice")
    return {**found["metrics"][measure], "users": found["users"]}


if __name__ == "__main__":
    main()
