"""Domains: one shared model vs separate per-domain models vs a shared base + per-domain LoRA adapters; writes JSON.

Usage (Beauty + Sports as two domains; parts that do not depend on each other can run in parallel):
    .venv/bin/python -m benchmarks.domain_adapters --stage shared --seed 0              # (a) one SASRec, every domain
    .venv/bin/python -m benchmarks.domain_adapters --stage separate --domain beauty --seed 0   # (b), per domain
    .venv/bin/python -m benchmarks.domain_adapters --stage adapters --domain beauty --seed 0 --variant NAME  # (c)
    .venv/bin/python -m benchmarks.domain_adapters --stage report   # -> benchmarks/results/domain-adapters.json
    .venv/bin/python -m benchmarks.domain_adapters --stage all      # every part of every seed and variant, then report

The config (benchmarks/configs/domain-adapters.yaml) names the experiment configs, the domains, the seeds and the
adapter variants. Every part is trained by the pipeline (its train step): (a) the `shared` config on every domain's
users; (b) the same config with `data.domain` (that domain's users and items); (c) the `adapters` config with
`data.domain` over (a) of the same seed as `model.upstream.base`. Each part's model is tested per domain, every held-out
item ranked among its domain's items only (leave-one-out otherwise). As the parts were first made, the
process is seeded with the part's seed before the model is built (and `train.seed` is the seed). The report gives
each variant's per-seed and mean test NDCG@10, and whether (c) >= max(a, b) on the mean and in how many seeds.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    REPO,
    Reproduce,
    benchmark_parser,
    command,
    parse_run,
    provenance,
    settings_from,
    write_result,
)
from pipelines.config import ExperimentConfig, load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.model_dir import load_model_dir
from recsys.data.prepared import load_prepared
from recsys.evaluation import evaluate
from recsys.inference import DomainScorer
from recsys.runtime.atomic import atomic_file
from recsys.runtime.device import resolve_device

logger = logging.getLogger(__name__)
WORK_DIR = Path(".cache/domains")  # the default --work-dir
STAGES = ("shared", "separate", "adapters", "report", "all")


@dataclass(frozen=True)
class Settings:
    shared: str  # experiment config of the model of every domain (a); with data.domain, of one domain (b)
    adapters: str  # experiment config of the domain adapters (c); its model.upstream.base is (a) of the same seed
    domains: list[str]
    seeds: list[int]
    variants: dict[str, dict[str, Any]]  # label -> dotted overrides of the adapters config
    experiment: dict[str, Any] = field(default_factory=dict)  # dotted overrides of every part's config
    shared_overrides: dict[str, Any] = field(default_factory=dict)  # of the shared model (a) only
    separate_overrides: dict[str, Any] = field(default_factory=dict)  # of the per-domain models (b) only


@dataclass(frozen=True)
class Part:
    """One trained model of the experiment."""

    stage: str
    seed: int
    domain: str | None = None  # (b), (c): the domain trained
    variant: str | None = None  # (c): the adapter variant

    @property
    def name(self) -> str:
        return "-".join(str(p) for p in (self.stage, self.variant, self.domain, f"s{self.seed}") if p is not None)


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    for part in all_parts(settings):
        part_config(settings, part, WORK_DIR)  # every part's config must load
    return settings


def all_parts(settings: Settings) -> list[Part]:
    """Every part, in an order that trains each base before its adapters."""
    parts = [Part("shared", seed) for seed in settings.seeds]
    parts += [Part("separate", seed, domain) for seed in settings.seeds for domain in settings.domains]
    variants = settings.variants
    return parts + [Part("adapters", s, d, v) for s in settings.seeds for v in variants for d in settings.domains]


def part_config(settings: Settings, part: Part, work: Path) -> ExperimentConfig:
    """The experiment config that trains `part` (tracking off: the parts are recorded as JSON in the work dir)."""
    common = {**settings.experiment, "train.seed": part.seed, "tracking.enabled": False, "train.progress": False}
    if part.stage == "shared":
        config = load_config(REPO / settings.shared, {**common, **settings.shared_overrides})
    elif part.stage == "separate":
        separate = {**common, **settings.separate_overrides, "data.domain": part.domain}
        config = load_config(REPO / settings.shared, separate)
    else:
        shared = load_config(REPO / settings.shared, {**common, **settings.shared_overrides})
        base = work / "models" / f"{shared.name}-{Part('shared', part.seed).name}"
        if part.variant not in settings.variants:
            raise SystemExit(f"--variant {part.variant!r} is not in the config. Fix: one of {list(settings.variants)}")
        variant = settings.variants[part.variant]
        config = load_config(REPO / settings.adapters, {**common, **variant, "data.domain": part.domain,
                                                         "model.upstream.base": str(base)})  # fmt: skip
    return config.model_copy(update={"name": f"{config.name}-{part.name}"})


def train_part(settings: Settings, part: Part, work: Path) -> dict[str, Any]:
    """Train `part` through the pipeline and test it on each of its domains; its record."""
    config = part_config(settings, part, work)
    torch.manual_seed(part.seed)  # the model's initial weights, as when the parts were first made
    outputs, _ = run_pipeline(config, work, until="train_retriever", rerun=["train_retriever"])
    assert outputs.model is not None and outputs.data is not None
    trained = load_model_dir(outputs.model.model_dir)
    model, metrics = trained.model.eval(), outputs.model.metrics
    domains = settings.domains if part.domain is None else [part.domain]
    test = {}
    for domain in domains:
        data = load_prepared(outputs.data.data_dir, domain)
        test[domain] = evaluate(model, data.eval_split("test"), data.num_items, config.eval).metrics
    device = resolve_device(config.train.hardware.device)
    record: dict[str, Any] = {
        **asdict(part),
        "test": test,
        "train_seconds": round(metrics["train_seconds"], 1),
        "best_epoch": metrics["best_epoch"],
        "epochs_run": metrics["epochs_run"],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": sum(p.numel() for p in model.parameters()),
        "command": command(),
    }
    if isinstance(model, DomainScorer):
        assert part.domain is not None
        record["adapter_parameters"] = model.adapter_parameters(part.domain)  # type: ignore[attr-defined]
        record["base_parameters"] = model.base_parameters()  # type: ignore[attr-defined]
    return record


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """The domains, seeds and adapter variants of the result's table that are not the config's."""
    for domain, row in result["domains"].items():
        if domain not in settings.domains:
            yield f"domain {domain!r} is not in the config"
        seeds = {int(seed) for seed in row["a_shared"].get("ndcg@10_per_seed", {0: None})}
        if seeds != set(settings.seeds):
            yield f"{domain}: seeds {sorted(seeds)}, the config {settings.seeds}"
        variants = row.get("c_base_plus_adapters")
        if variants is not None and set(variants) != set(settings.variants):
            yield f"{domain}: adapter variants {sorted(variants)}, the config {sorted(settings.variants)}"


def main(argv: list[str] | None = None) -> Path | None:
    parser = benchmark_parser(__doc__, "benchmarks/configs/domain-adapters.yaml")
    parser.add_argument("--stage", choices=STAGES, required=True)
    parser.add_argument("--seed", type=int, help="shared / separate / adapters: the part's seed")
    parser.add_argument("--domain", help="separate / adapters: the domain to train (e.g. beauty)")
    parser.add_argument("--variant", help="adapters: the adapter variant (a label of the config's variants)")
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR)
    parser.add_argument("--name", default="domain-adapters", help="report: the results JSON's name")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    work, parts_dir = args.work_dir.resolve(), args.work_dir / "parts"
    if args.stage in ("report", "all"):
        if args.stage == "all":
            for part in all_parts(settings):
                _write_part(parts_dir, part, train_part(settings, part, work))
        return report(settings, parts_dir, args.results_dir, args.name, reproduce)
    part = _part_of(args, settings)
    _write_part(parts_dir, part, train_part(settings, part, work))
    return None


def report(settings: Settings, parts: Path, results_dir: Path, name: str, reproduce: Reproduce) -> Path:
    """Merge the parts into one table per domain: test NDCG@10 of (a), (b) and each adapter variant (c) per seed and
    on average, and whether (c) >= max(a, b) on average and in how many seeds."""
    loaded = {p.stem: json.loads(p.read_text()) for p in sorted(parts.glob("*.json"))}
    missing = [part.name for part in all_parts(settings) if part.name not in loaded]
    if missing:
        raise SystemExit(f"parts missing in {parts}: {missing}. Fix: run their stages (this module's docstring)")
    table: dict[str, Any] = {}
    for domain in settings.domains:
        a = _per_seed(loaded, [Part("shared", seed) for seed in settings.seeds], domain)
        b = _per_seed(loaded, [Part("separate", seed, domain) for seed in settings.seeds], domain)
        table[domain] = {"a_shared": _summary(a), "b_separate": _summary(b), "c_base_plus_adapters": {}}
        for variant in settings.variants:
            c = _per_seed(loaded, [Part("adapters", seed, domain, variant) for seed in settings.seeds], domain)
            some = loaded[Part("adapters", settings.seeds[0], domain, variant).name]
            table[domain]["c_base_plus_adapters"][variant] = {
                **_summary(c),
                "adapter_share_of_base": some["adapter_parameters"] / some["base_parameters"],
                "c_at_least_max_a_b_on_mean": _mean(c) >= max(_mean(a), _mean(b)),
                "seeds_where_c_at_least_max_a_b": sum(c[seed] >= max(a[seed], b[seed]) for seed in c),
            }
            print(f"{domain} {variant}: N@10 a {_mean(a):.4f}, b {_mean(b):.4f}, c {_mean(c):.4f} ({len(c)} seeds)")
    result = {
        "settings": asdict(settings),
        "domains": table,
        "parts": loaded,
        **provenance(),
    }
    path = write_result(name, result, results_dir, reproduce)
    print(f"-> {path}")
    return path


def _part_of(args: argparse.Namespace, settings: Settings) -> Part:
    if args.seed is None or (args.stage != "shared" and args.domain is None):
        raise SystemExit(f"--stage {args.stage} trains one part: pass --seed (and --domain, but for shared)")
    if args.domain is not None and args.domain not in settings.domains:
        raise SystemExit(f"--domain {args.domain!r} is not a domain of the config. Fix: one of {settings.domains}")
    variant = args.variant if args.stage == "adapters" else None
    if args.stage == "adapters" and variant is None:
        raise SystemExit(f"--stage adapters needs --variant. Fix: one of {list(settings.variants)}")
    return Part(args.stage, args.seed, args.domain if args.stage != "shared" else None, variant)


def _write_part(parts: Path, part: Part, record: dict[str, Any]) -> None:
    parts.mkdir(parents=True, exist_ok=True)
    with atomic_file(parts / f"{part.name}.json") as tmp:
        tmp.write_text(json.dumps(record, indent=2))
    logger.info("%s: %s", part.name, {d: round(m["ndcg@10"], 4) for d, m in record["test"].items()})


def _per_seed(loaded: dict[str, Any], parts: list[Part], domain: str) -> dict[int, float]:
    return {part.seed: loaded[part.name]["test"][domain]["ndcg@10"] for part in parts}


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)


def _summary(values: dict[int, float]) -> dict[str, Any]:
    mean = _mean(values)
    spread = (sum((v - mean) ** 2 for v in values.values()) / max(len(values) - 1, 1)) ** 0.5
    return {"ndcg@10_per_seed": values, "ndcg@10_mean": mean, "ndcg@10_std": spread}


if __name__ == "__main__":
    main()
