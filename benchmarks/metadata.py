"""LLM-written item metadata on Beauty: validity and speed of the local model, per device, and how right its
categories are against Amazon's (docs/enrich.md).

Usage:
    .venv/bin/python -m benchmarks.metadata                              # the CPU runs
    .venv/bin/python -m benchmarks.metadata --set only=[gpu-batched]     # on a GPU
    .venv/bin/python -m benchmarks.metadata --set 'only=[]'              # score the kept records only (no LLM)

Each run enriches its items from a fresh cache (so everything is generated, nothing read back) and records `items`,
`valid_fraction`, `failed`, `truncated`, `items_per_second` and `seconds_per_item`, with its machine. Runs not in
`only` keep their previous record. `--set resume=true` goes on from the run's cache in `--work-dir` instead (a run
spread over calls: the speed counts the items generated in this call only). A run with `keep_records` writes its
records beside the result (`beauty-item-metadata.parquet`): the enrich step's `records` option reuses them, so
later runs, sessions and CI need not generate them again (`keep_records: true` keeps them as
`beauty-item-metadata.parquet`, a file name keeps them under that name: a run with another prompt or decoding keeps
its own).

Every call scores the category of every kept records file against `categories_csv` (Amazon's category path of every
item): `category_accuracy`, per run, holds the top-level, leaf, prefix and per-level accuracy of the valid records
with their bootstrap intervals over items (`recsys.evaluation.categories`), and how spread the answers are beside
the truth's spread at the same depth.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import torch

from benchmarks.common import benchmark_parser, machine, parse_run, settings_from, versions, write_result
from pipelines.enrich import enrich_texts
from recsys.data.schema import ITEM_ID
from recsys.enrich.cache import EnrichCache
from recsys.enrich.config import EnrichConfig, make_backend
from recsys.enrich.record import FIELDS, load_prompt
from recsys.enrich.run import enrich_catalogue
from recsys.evaluation.categories import SEPARATOR, category_accuracy, distribution, split_path
from recsys.evaluation.uncertainty import Uncertainty, paired_difference

RECORDS_FILE = "beauty-item-metadata.parquet"


@dataclass(frozen=True)
class Settings:
    items_csv: str
    model: str = "gemma3-270m"
    prompt: str = "item-metadata-v1"
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> device, threads, batch_size, items[,
    # prompt: this run's, else `prompt`]
    pairs: list[list[str]] = field(default_factory=list)  # [a, b]: runs with kept records, a - b on their category
    only: list[str] = field(default_factory=list)
    resume: bool = False
    seed: int = 0
    examples: int = 10
    categories_csv: str | None = None  # item_id,categories: the true category path of every item (None: not scored)
    uncertainty: Uncertainty = field(default_factory=Uncertainty)  # of the accuracy intervals (bootstrap over items)
    depth: int = 2  # the spread of answers and truth is counted at this many levels (the prompt's list has 2)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    unknown = (set(settings.only) | {label for pair in settings.pairs for label in pair}) - settings.runs.keys()
    if unknown:
        raise SystemExit(f"only / pairs name runs the config lacks: {sorted(unknown)}. Fix: use its runs, "
                         f"{sorted(settings.runs)}")  # fmt: skip
    for a, b in settings.pairs:
        if not (kept_records(settings.runs[a]) and kept_records(settings.runs[b])):
            raise SystemExit(f"pair {a} - {b}: both runs need keep_records (their records are what is compared)")
    return settings


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/beauty-metadata.yaml")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench-metadata"))
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    catalogue = pl.read_csv(settings.items_csv, schema_overrides={"item_id": pl.String}).sample(
        fraction=1.0, shuffle=True, seed=settings.seed
    )
    previous = args.results_dir / "beauty-metadata.json"
    runs = json.loads(previous.read_text())["runs"] if previous.is_file() else {}
    for label in settings.only:
        run = _run(settings, label, catalogue, args.work_dir, args.results_dir)
        runs[label] = {**run, "reproduce": asdict(reproduce)}  # each run's own command (runs differ in machine)
    for label, run in runs.items():  # how far a small run's records agree with the kept ones (device, batch)
        records = args.work_dir / f"{label}.parquet"
        if not run.get("keep_records") and records.is_file() and (args.results_dir / RECORDS_FILE).is_file():
            run["agreement_with_kept_records"] = agreement(records, args.results_dir / RECORDS_FILE)
    result = {"catalogue_items": catalogue.height, "model": settings.model, "prompt": settings.prompt, "runs": runs}
    if settings.categories_csv:
        result["category_accuracy"] = {
            label: category_scores(args.results_dir / kept, settings)
            for label, run in runs.items()
            if (kept := kept_records(run)) and (args.results_dir / kept).is_file()
        }
        print(json.dumps({k: v["accuracy"]["level_2"]["value"] for k, v in result["category_accuracy"].items()}))
        result["category_pairs"] = [
            category_pair(a, b, args.results_dir / kept_records(runs[a]), args.results_dir / kept_records(runs[b]),
                          settings)
            for a, b in settings.pairs
            if a in runs and b in runs and all((args.results_dir / kept_records(runs[x])).is_file() for x in (a, b))
        ]  # fmt: skip
    path = write_result("beauty-metadata", result, args.results_dir, reproduce)
    print(json.dumps({k: {m: v.get(m) for m in ("valid_fraction", "items_per_second")} for k, v in runs.items()}))
    print(f"-> {path}")
    return path


def _run(settings: Settings, label: str, catalogue: pl.DataFrame, work: Path, results: Path) -> dict[str, Any]:
    run = settings.runs[label]
    if run["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"run {label} needs a CUDA GPU and this machine has none. Fix: run it on the lent GPU")
    items = catalogue.head(run["items"]) if run.get("items") else catalogue
    cache_dir = work / label
    if not settings.resume:
        shutil.rmtree(cache_dir, ignore_errors=True)  # a fresh cache: every item is generated
    prompt = run.get("prompt", settings.prompt)
    config = EnrichConfig(model=settings.model, prompt=prompt, device=run["device"],
                          threads=run.get("threads"), batch_size=run["batch_size"])  # fmt: skip
    backend = make_backend(config, work)
    kept = kept_records(run)
    out = results / kept if kept else work / f"{label}.parquet"
    cache = EnrichCache(cache_dir)
    try:
        summary = enrich_catalogue(items["item_id"].to_list(), enrich_texts(items, config.text_fields), backend,
                                   load_prompt(prompt), cache, out, batch_size=run["batch_size"])  # fmt: skip
    finally:
        cache.close()
    examples = pl.read_parquet(out).head(settings.examples).to_dicts()
    gpu = torch.cuda.get_device_name() if run["device"] == "cuda" else None
    return {
        **run,
        "prompt": prompt,
        **summary.record(),
        "gpu": gpu,
        "examples": examples,
        "machine": machine(),
        "versions": versions("transformers", "torch"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def kept_records(run: dict[str, Any]) -> str | None:
    """The file name a run keeps its records under beside the result (`keep_records`: true or a name), or None."""
    kept = run.get("keep_records")
    return RECORDS_FILE if kept is True else kept or None


def category_scores(records: Path, settings: Settings) -> dict[str, Any]:
    """How right the records' categories are against the true paths of `settings.categories_csv`: the accuracy of
    the valid records (a failed answer, or an item never asked, is counted apart, not scored), and the spread of
    answers and truth at `settings.depth` levels, with the commonest (answer, truth) pairs at that depth."""
    assert settings.categories_csv is not None
    truth = pl.read_csv(settings.categories_csv, schema_overrides={ITEM_ID: pl.String, "categories": pl.String})
    answers = pl.read_parquet(records).select(ITEM_ID, "status", "category")
    both = truth.join(answers, on=ITEM_ID, how="left")
    ok = both.filter(pl.col("status") == "ok")
    predicted = [split_path(c or "") for c in ok["category"]]
    true = [split_path(c) for c in ok["categories"]]
    cut = settings.depth
    pairs = Counter((SEPARATOR.join(p[:cut]), SEPARATOR.join(t[:cut])) for p, t in zip(predicted, true, strict=True))
    answer_vs_truth = [
        {"answer": answer, "truth": path, "share": round(count / max(ok.height, 1), 4)}
        for (answer, path), count in pairs.most_common(10)
    ]
    return {
        "records": records.name,
        "truth": settings.categories_csv,
        "catalogue_items": truth.height,
        "scored": ok.height,
        "failed": both.filter(pl.col("status") == "failed").height,
        "not_asked": both.filter(pl.col("status").is_null()).height,
        "records_not_in_truth": answers.join(truth, on=ITEM_ID, how="anti").height,
        "accuracy": {name: a.to_dict() for name, a in category_accuracy(predicted, true, settings.uncertainty).items()},
        "uncertainty": {**settings.uncertainty.to_dict(), "method": "percentile bootstrap over items"},
        "predicted": distribution(predicted, settings.depth),
        "true": distribution(true, settings.depth),
        "answer_vs_truth": answer_vs_truth,  # the commonest (answer, truth) pairs at `depth` levels
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
    }


def category_pair(a: str, b: str, records_a: Path, records_b: Path, settings: Settings) -> dict[str, Any]:
    """Run a minus run b on category accuracy at each level, on the items both answered validly (the same items, so
    paired: `paired_difference` over items), with each one's accuracy there."""
    assert settings.categories_csv is not None
    truth = pl.read_csv(settings.categories_csv, schema_overrides={ITEM_ID: pl.String, "categories": pl.String})
    answers = [pl.read_parquet(r).filter(pl.col("status") == "ok").select(ITEM_ID, "category") for r in (records_a,
               records_b)]  # fmt: skip
    both = truth.join(answers[0], on=ITEM_ID).join(answers[1], on=ITEM_ID, suffix="_b")
    true = [split_path(c) for c in both["categories"]]
    levels = {}
    for level in range(1, settings.depth + 1):
        deep = [i for i, path in enumerate(true) if len(path) >= level]
        if not deep:
            continue
        right = [[float(split_path(both[column][i])[:level] == true[i][:level]) for column in ("category",
                  "category_b")] for i in deep]  # fmt: skip
        values = torch.tensor(right, dtype=torch.float64)  # (N, 2)
        (difference,) = paired_difference(values[:, :1], values[:, 1:], [f"level_{level}"], settings.uncertainty)
        levels[f"level_{level}"] = {"a": float(values[:, 0].mean()), "b": float(values[:, 1].mean()),
                                    **difference.to_dict()}  # fmt: skip
    return {"a": a, "b": b, "items": both.height, "levels": levels,
            "uncertainty": {**settings.uncertainty.to_dict(), "method": "paired bootstrap over items"}}  # fmt: skip


def agreement(records: Path, kept: Path) -> dict[str, Any]:
    """Per field, the share of the items of `records` whose value equals the kept records' (and all fields at once):
    greedy decoding of a small model flips on small numeric differences (another device, batch or padding)."""
    fields = ["status", *FIELDS]
    both = (
        pl.read_parquet(records)
        .select(ITEM_ID, *fields)
        .join(pl.read_parquet(kept).select(ITEM_ID, *fields), on=ITEM_ID, suffix="_kept")
    )
    same = {f: both.select((pl.col(f) == pl.col(f"{f}_kept")).fill_null(False)).to_series() for f in fields}
    whole = pl.DataFrame(same).select(pl.all_horizontal(fields)).to_series()
    return {"items": both.height, "record": float(whole.mean() or 0.0),
            **{f: float(v.mean() or 0.0) for f, v in same.items()}}  # fmt: skip


if __name__ == "__main__":
    main()
