"""Domains: one shared model vs separate per-domain models vs a shared base + per-domain LoRA adapters; writes JSON.

Usage (Beauty + Sports as two domains; the stages can run in parallel where they do not depend on each other):
    .venv/bin/python benchmarks/domain_adapters.py --stage shared            # (a) one SASRec on every domain
    .venv/bin/python benchmarks/domain_adapters.py --stage separate --domain beauty   # (b), once per domain
    .venv/bin/python benchmarks/domain_adapters.py --stage separate --domain sports
    .venv/bin/python benchmarks/domain_adapters.py --stage adapters --domain beauty   # (c), after (a)
    .venv/bin/python benchmarks/domain_adapters.py --stage adapters --domain sports
    .venv/bin/python benchmarks/domain_adapters.py --stage report  # -> benchmarks/results/domain-adapters.json
Every stage takes `--seed` (adapters: over the shared model of the same seed); adapter variants differ by `--rank`
and `--embedding-rank`. The report gives each variant's per-seed and mean test NDCG@10.

Data: `amazon-p5-domains` over `--data-dir` (the folders named by `--domains`), prepared once into the work dir;
every variant ranks a user's test item among their domain's items only (DESIGN.md leave-one-out otherwise).
(a) SASRec trained on all users (validated on all items; `--softmax-within-domain`: each target's softmax over its
domain's items); (b) the same SASRec trained on one domain's users
(softmax over that domain's items); (c) (a) frozen, plus a rank-r LoRA adapter per domain on every linear layer
of its blocks, trained on that domain's users (MLoRA). All with the SASRec settings of configs/beauty-sasrec.yaml.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, versions, write_result
from features.prepare import prepare
from features.sources import load_source
from recsys.data.prepared import SequenceData, load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.domain_adapters import DomainAdaptedRetriever, DomainAdapterConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.atomic import atomic_file
from recsys.runtime.device import resolve_device
from recsys.training.trainer import TrainConfig, fit

logger = logging.getLogger("domain_adapters")
SASREC: dict[str, Any] = {
    "max_len": 50,
    "dim": 64,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 256,
    "dropout": 0.5,
    "attn_dropout": 0.5,
}
EVAL = EvalConfig(ks=(5, 10, 50))
STAGES = ("shared", "separate", "adapters", "report")


def main(argv: list[str] | None = None) -> Path | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=STAGES, required=True)
    parser.add_argument("--domain", help="separate / adapters: the domain to train (e.g. beauty)")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--domains", nargs="+", default=["amazon-beauty", "amazon-sports"])
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/domains"))
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--max-train-seconds", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="initialisation and batch order")
    parser.add_argument("--rank", type=int, default=8, help="adapters: LoRA rank of the block layers")
    parser.add_argument("--embedding-rank", type=int, default=0, help="adapters: rank of the item-embedding delta")
    parser.add_argument("--adapter-lr", type=float, default=2e-3)
    parser.add_argument("--name", default="domain-adapters", help="report: the results JSON's name")
    parser.add_argument(
        "--softmax-within-domain",
        action="store_true",
        help="shared: each target's softmax over its own domain's items (the others see theirs by construction)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    parts = args.work_dir / "parts"
    if args.stage == "report":
        return report(parts, args.results_dir, args.name)
    if args.stage != "shared" and args.domain is None:
        raise SystemExit(f"--stage {args.stage} trains one domain: pass --domain (e.g. --domain beauty)")
    data = prepared(args.data_dir, args.domains, args.work_dir / "data")
    train = TrainConfig(
        epochs=args.epochs,
        batch_size=16,
        lr=1e-3,
        patience=args.patience,
        device=args.device,
        max_train_seconds=args.max_train_seconds,
        progress=False,
        seed=args.seed,
    )
    torch.manual_seed(args.seed)
    shared_state = args.work_dir / f"shared-s{args.seed}.pt"
    if args.stage == "shared":
        model: torch.nn.Module = SASRec(SASRecConfig(num_items=data.num_items, **SASREC))
        shared_train = TrainConfig(**{**asdict(train), "softmax_within_domain": args.softmax_within_domain})
        result = fit(model, data, shared_train, EVAL)
        with atomic_file(shared_state) as tmp:
            torch.save(model.state_dict(), tmp)
        domains = data.domains
        name = f"shared-s{args.seed}"
        extra: dict[str, Any] = {"softmax_within_domain": args.softmax_within_domain}
    elif args.stage == "separate":
        model = SASRec(SASRecConfig(num_items=data.num_items, **SASREC))
        result = fit(model, data.for_domain(args.domain), train, EVAL)
        domains = [args.domain]
        name = f"separate-{args.domain}-s{args.seed}"
        extra = {}
    else:
        model = adapted(data, shared_state, args.rank, args.embedding_rank)
        train = TrainConfig(**{**asdict(train), "lr": args.adapter_lr})
        result = fit(model, data.for_domain(args.domain), train, EVAL)
        domains = [args.domain]
        name = f"adapters-{args.domain}-r{args.rank}-e{args.embedding_rank}-lr{args.adapter_lr:g}-s{args.seed}"
        extra = {"rank": args.rank, "embedding_rank": args.embedding_rank, "adapter_lr": args.adapter_lr}
    device = resolve_device(args.device)
    part: dict[str, Any] = {
        "stage": args.stage,
        "seed": args.seed,
        "test": {d: test_metrics(model, data.for_domain(d)) for d in domains},
        "train_seconds": round(result.train_seconds, 1),
        "best_epoch": result.best_epoch,
        "epochs_run": len(result.epoch_seconds),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": sum(p.numel() for p in model.parameters()),
        "command": command(),
        **extra,
    }
    if isinstance(model, DomainAdaptedRetriever):
        part["adapter_parameters"] = model.adapter_parameters(args.domain)
        part["base_parameters"] = model.base_parameters()
    parts.mkdir(parents=True, exist_ok=True)
    with atomic_file(parts / f"{name}.json") as tmp:
        tmp.write_text(json.dumps(part, indent=2))
    logger.info("%s: %s", name, {d: round(m["ndcg@10"], 4) for d, m in part["test"].items()})
    return None


def test_metrics(model: torch.nn.Module, data: SequenceData) -> dict[str, float]:
    return evaluate(model.eval(), data.eval_split("test"), data.num_items, EVAL).metrics  # type: ignore[arg-type]


def prepared(data_dir: Path, domains: list[str], out: Path) -> SequenceData:
    """The multi-domain data set, prepared once (preparing is deterministic, so parallel stages agree)."""
    if not (out / "meta.json").is_file():
        prepare(load_source("amazon-p5-domains", data_dir, domains=domains), out)
    return load_prepared(out)


def adapted(data: SequenceData, shared_state: Path, rank: int, embedding_rank: int) -> DomainAdaptedRetriever:
    if not shared_state.is_file():
        raise SystemExit(f"{shared_state} is missing. Fix: run --stage shared with the same --seed first (the base)")
    base = SASRec(SASRecConfig(num_items=data.num_items, **SASREC))
    base.load_state_dict(torch.load(shared_state, map_location="cpu", weights_only=True))
    config = DomainAdapterConfig(domains=tuple(data.domains), rank=rank, embedding_rank=embedding_rank)
    return DomainAdaptedRetriever(config, base, data.item_domains())


def report(parts: Path, results_dir: Path, name: str) -> Path:
    """Merge the stages' parts into one table per domain: test NDCG@10 of (a), (b) and each adapter variant (c)
    per seed and on average, and whether (c) >= max(a, b) on average and in how many seeds."""
    loaded = {p.stem: json.loads(p.read_text()) for p in sorted(parts.glob("*.json"))}
    shared = {part["seed"]: part for key, part in loaded.items() if key.startswith("shared-")}
    if not shared:
        raise SystemExit(f"no {parts}/shared-s*.json. Fix: run the stages in this script's docstring first")
    table: dict[str, Any] = {}
    for domain in next(iter(shared.values()))["test"]:
        separate = {p["seed"]: p for k, p in loaded.items() if k.startswith(f"separate-{domain}-")}
        variants: dict[str, dict[int, dict[str, Any]]] = {}
        for key, part in loaded.items():
            if key.startswith(f"adapters-{domain}-"):
                variant = f"rank{part['rank']}-embedding{part['embedding_rank']}-lr{part['adapter_lr']:g}"
                variants.setdefault(variant, {})[part["seed"]] = part
        missing = [s for by_seed in (separate, *variants.values()) for s in shared if s not in by_seed]
        if not separate or not variants or missing:
            raise SystemExit(f"{domain}: parts missing (seeds {sorted(set(missing))}). Fix: run the stages for them")
        a = _per_seed(shared, domain)
        b = _per_seed(separate, domain)
        best_ab = {seed: max(a[seed], b[seed]) for seed in a}
        table[domain] = {"a_shared": _summary(a), "b_separate": _summary(b), "c_base_plus_adapters": {}}
        for variant, by_seed in sorted(variants.items()):
            c = _per_seed(by_seed, domain)
            some = next(iter(by_seed.values()))
            table[domain]["c_base_plus_adapters"][variant] = {
                **_summary(c),
                "adapter_share_of_base": some["adapter_parameters"] / some["base_parameters"],
                "c_at_least_max_a_b_on_mean": _mean(c) >= max(_mean(a), _mean(b)),
                "seeds_where_c_at_least_max_a_b": sum(c[seed] >= best_ab[seed] for seed in c),
            }
            print(f"{domain} {variant}: N@10 a {_mean(a):.4f}, b {_mean(b):.4f}, c {_mean(c):.4f} ({len(c)} seeds)")
    result = {
        "name": name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {"sasrec": SASREC, "ks": list(EVAL.ks), "ranking": "within the user's domain", "metric": "ndcg@10"},
        "domains": table,
        "parts": loaded,
        "machine": machine(),
        "versions": versions(),
        "command": command(),
    }
    path = write_result(result["name"], result, results_dir)
    print(f"-> {path}")
    return path


def _per_seed(parts: dict[int, dict[str, Any]], domain: str) -> dict[int, float]:
    return {seed: part["test"][domain]["ndcg@10"] for seed, part in sorted(parts.items())}


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)


def _summary(values: dict[int, float]) -> dict[str, Any]:
    mean = _mean(values)
    spread = (sum((v - mean) ** 2 for v in values.values()) / max(len(values) - 1, 1)) ** 0.5
    return {"ndcg@10_per_seed": values, "ndcg@10_mean": mean, "ndcg@10_std": spread}


if __name__ == "__main__":
    main()
