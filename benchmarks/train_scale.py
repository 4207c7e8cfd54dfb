"""One training epoch at catalogue scale, streamed from a prepared directory's parts: tokens/s and peak memory; JSON.

Usage:
    .venv/bin/python -m benchmarks.train_scale                         # CPU: 6x10^5 users x 10^6 items (~10^7 tokens)
    .venv/bin/python -m benchmarks.train_scale --set device=cuda --set users=6000000 --set rows_per_batch=256

Settings: benchmarks/configs/train-scale.yaml (`--config`, `--set KEY=VALUE`). The synthetic data set of `users` x
`items` (`features.synthetic`) is prepared into `data_dir` by `features.prepare` when that directory does not hold it
yet (its wall time is recorded apart). Then a SASRec of the configured shape trains one epoch exactly as
`recsys.training.trainer` does (`train_one_epoch`, the next-item recipe with `loss: auto`, which picks the sampled
softmax with mixed negatives above 100,000 items), its rows streamed from the prepared parts `buffer_parts` at a time
(`recsys.data.prepared.PreparedParts`); with `model_dir` set, the trained model is written there as `recsys train`
writes one (to build an index of its item vectors and serve it). Recorded: the epoch's wall time, the targets
(tokens) trained on and tokens/s, the share of the epoch spent reading and packing the parts, the peak memory
(resident set; allocated GPU memory on a GPU), and, as a check that the epoch learned, NDCG@10 on a seeded sample of
`valid_users` validation users beside the popularity baseline on the same users (a sample: not the protocol's
figure). Writes
benchmarks/results/train-scale-<device type>.json.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from features.prepare import prepare
from features.sources import open_synthetic
from pipelines.config import ExperimentConfig, load_config
from recsys.artifacts.model_dir import POPULARITY_VALID, write_model_dir
from recsys.data.batching import PackedBatch
from recsys.data.prepared import PreparedParts
from recsys.evaluation import EvalConfig, UserSample, evaluate
from recsys.models.popularity import Popularity, PopularityConfig
from recsys.models.registry import build_model
from recsys.models.sasrec import SASRec
from recsys.runtime.budget import peak_resident_gib
from recsys.runtime.device import apply_cpu_threads, resolve_device, use_bf16_autocast
from recsys.runtime.distributed import Workers
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.optimization import build_optimization
from recsys.training.recipes import NextItemRecipe, NextItemTraining, recipe_for
from recsys.training.trainer import train_one_epoch

logger = logging.getLogger("benchmarks.train_scale")
EXPERIMENT = "configs/train-scale/sasrec.yaml"  # the model and its training; the settings below override it


@dataclass(frozen=True)
class Settings:
    users: int = 600_000
    items: int = 1_000_000
    data_dir: str = ".cache/train-scale/{users}x{items}"  # prepared here unless it is already
    dim: int = 64
    max_history: int = 50
    num_layers: int = 2
    loss: str = "auto"  # model.training.loss
    rows_per_batch: int = 16  # packed rows of max_history tokens per step
    num_negatives: int = 1024
    sparse_item_gradients: bool | None = None  # None: on a CPU with the sampled softmax (docs/scale.md)
    buffer_parts: int = 4
    lr: float = 1e-3
    valid_users: int = 10_000
    device: str = "cpu"
    threads: int | None = None
    seed: int = 0
    model_dir: str | None = None  # write the trained model here (a `recsys train` model directory), e.g. to serve it


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/train-scale.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = resolve_device(settings.device)
    if device.type == "cpu":
        apply_cpu_threads(settings.threads)
    data_dir, prepare_seconds = _prepared(settings)
    parts = PreparedParts.open(data_dir, settings.buffer_parts)
    experiment = experiment_of(settings, device.type)
    torch.manual_seed(settings.seed)
    model = build_model(experiment.model.name, experiment.model.params, parts.num_items)
    assert isinstance(model, SASRec)
    recipe = recipe_for(model, parts, experiment.train.optimization.batch_size, experiment.model.training_settings())
    assert isinstance(recipe, NextItemRecipe)
    model = model.to(device)
    optimization = build_optimization(model, lr=settings.lr, weight_decay=0.0, schedule="constant", warmup_steps=0,
                                      total_steps=0, fused=device.type == "cuda")  # fmt: skip
    generator = torch.Generator().manual_seed(settings.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    counter = BatchCounter()
    start = time.perf_counter()
    loss = train_one_epoch(model, DataParallelLoss(model, recipe, Workers(), find_unused_parameters=False),
                           counter.batches(parts, recipe, generator), optimization, use_bf16_autocast("auto", device),
                           generator)  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak_rss = peak_resident_gib()
    gpu = (
        {"peak_gpu_memory_gib": significant(torch.cuda.max_memory_allocated() / 2**30)} if device.type == "cuda" else {}
    )
    check = _sample_check(model.eval(), parts, settings)
    if settings.model_dir:
        write_model_dir(
            Path(settings.model_dir),
            experiment.model_dump(mode="json"),
            model.cpu(),
            data_dir,
            _model_dir_metrics(check),
        )
    out = {
        "settings": asdict(settings),
        "device": device.type,
        "data": {
            "users": parts.num_users,
            "items": parts.num_items,
            "parts": len(parts.files),
            "interactions_on_disk_gib": significant(sum(p.stat().st_size for p in parts.files) / 2**30),
            "prepare_seconds": prepare_seconds,
        },
        "loss": "full_softmax" if recipe.sampling_probs is None else "sampled_softmax (mixed negatives)",
        "sparse_item_gradients": bool(model.item_emb is not None and model.item_emb.sparse),
        "epoch_seconds": significant(seconds),
        "tokens": counter.tokens,
        "tokens_per_second": significant(counter.tokens / seconds),
        "steps": counter.steps,
        "read_and_pack_share": significant(counter.data_seconds / seconds),
        "mean_loss": significant(loss),
        "peak_rss_gib": significant(peak_rss),
        **gpu,
        "sample_check": check,
        **provenance(),
    }
    path = write_result(f"train-scale-{device.type}", out, args.results_dir, reproduce)
    print({k: v for k, v in out.items() if k not in ("machine", "versions", "command")}, f"-> {path}", sep="\n")
    return path


def experiment_of(settings: Settings, device_type: str) -> ExperimentConfig:
    """The experiment this run is: `EXPERIMENT` with the settings' sizes, shape and optimisation, as `recsys train`
    would read it (what a model directory written from it records)."""
    sparse = settings.sparse_item_gradients
    if sparse is None:  # sparse rows pay on CPUs, not on a GPU (docs/scale.md); they need the sampled softmax
        training = NextItemTraining(loss=settings.loss)  # type: ignore[arg-type]
        sparse = training.resolved_loss(settings.items) == "sampled_softmax" and device_type == "cpu"
    return load_config(REPO / EXPERIMENT, {
        "data.options.num_users": settings.users, "data.options.num_items": settings.items,
        "data.options.seed": settings.seed, "train.stream_parts": settings.buffer_parts,
        "model.params.dim": settings.dim, "model.params.ffn_dim": 4 * settings.dim,
        "model.params.max_history": settings.max_history, "model.params.num_layers": settings.num_layers,
        "model.training.loss": settings.loss, "model.training.num_negatives": settings.num_negatives,
        "model.training.sparse_item_gradients": sparse,
        "train.optimization.batch_size": settings.rows_per_batch, "train.optimization.lr": settings.lr,
        "train.seed": settings.seed, "train.schedule.valid_users": settings.valid_users,
        "train.hardware.threads": settings.threads,
    })  # fmt: skip


def _prepared(settings: Settings) -> tuple[Path, float | None]:
    """The prepared directory of the settings' synthetic data set, prepared now (timed) unless it already is."""
    data_dir = Path(settings.data_dir.format(users=settings.users, items=settings.items))
    if (data_dir / "meta.json").is_file():
        return data_dir, None
    start = time.perf_counter()
    prepare(open_synthetic(num_users=settings.users, num_items=settings.items, seed=settings.seed), data_dir)
    return data_dir, significant(time.perf_counter() - start)


class BatchCounter:
    """Counts the epoch's steps and targets, and the time spent producing its batches (reading and packing)."""

    def __init__(self) -> None:
        self.steps, self.tokens, self.data_seconds = 0, 0, 0.0

    def batches(
        self, parts: PreparedParts, recipe: NextItemRecipe, generator: torch.Generator
    ) -> Iterator[PackedBatch]:
        pieces = parts.training_epoch(generator)
        while True:
            start = time.perf_counter()
            rows = next(pieces, None)
            batches = [] if rows is None else recipe.batches(rows, generator)
            self.data_seconds += time.perf_counter() - start
            if rows is None:
                return
            for batch in batches:
                self.steps += 1
                self.tokens += int((batch.targets != 0).sum())
                yield batch


def _model_dir_metrics(check: dict[str, Any]) -> dict[str, Any]:
    """metrics.json of the written model directory: the validation figures the registry's gate reads, from the seeded
    sample (and said to be one); no test split was ranked."""
    return {
        "valid": {"ndcg@10": check["ndcg@10"]},
        POPULARITY_VALID: {"ndcg@10": check["popularity ndcg@10"]},
        "test": {},
        "valid_sample": check,
    }


def _sample_check(model: SASRec, parts: PreparedParts, settings: Settings) -> dict[str, Any]:
    """NDCG@10 of the model and of popularity on a seeded sample of validation users (labelled a sample)."""
    sample = parts.select_users(UserSample(settings.valid_users, settings.seed).rows(parts.num_users))
    split, config = sample.eval_split("valid"), EvalConfig(ks=(10,), batch_size=128)  # popularity scores all V
    popularity = Popularity(PopularityConfig(parts.num_items))
    popularity.fit(parts.item_counts())
    return {
        "users (a seeded sample, not the protocol)": len(split.targets),
        "ndcg@10": significant(evaluate(model, split, parts.num_items, config).metrics["ndcg@10"]),
        "popularity ndcg@10": significant(evaluate(popularity, split, parts.num_items, config).metrics["ndcg@10"]),
    }


if __name__ == "__main__":
    main()
