"""Pipeline step `train`: prepared data + experiment config (+ the catalog's semantic IDs and content embeddings, and
the trained models the config builds on) -> trained model directory, tracked in MLflow."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipelines.config import ExperimentConfig
from pipelines.distill import distillation_recipe
from pipelines.tracking import OfflineTracker, Tracker, start_tracking
from recsys.artifacts.model_dir import POPULARITY_VALID, load_trained_model, model_sha256, write_model_dir
from recsys.artifacts.per_user import PerUserRanks
from recsys.data.categories import category_table
from recsys.data.prepared import EvalSplit, PreparedParts, SequenceData, TrainingData, load_prepared
from recsys.data.schema import ITEM_IDX
from recsys.data.splits import TEST, VALID
from recsys.enrich.columns import with_item_metadata
from recsys.errors import ConfigError
from recsys.evaluation import evaluate
from recsys.evaluation.slices import slice_metrics
from recsys.inference import VectorScorer
from recsys.models.family import Input, Model, ModelInputs, Upstream
from recsys.models.popularity import Popularity, PopularityConfig
from recsys.models.registry import build_model, model_family
from recsys.runtime.distributed import Workers
from recsys.semantic_ids.codes import read_semantic_ids
from recsys.semantic_ids.content import item_texts, read_content_embeddings
from recsys.training.capabilities import FitsItemCounts, TrainsPerDomain
from recsys.training.recipes import NextItemTraining, QueryBank, Recipe, RecipeInputs, recipe_for, training_named
from recsys.training.trainer import FitResult, fit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogFeatures:
    """What earlier steps derived from the catalog, for the models that read it (None: not built)."""

    semantic_ids: Path | None = None  # semantic_ids.parquet
    content_embeddings: Path | None = None  # content_embeddings.npy
    content_encoder: str | None = None  # the encoder that made them (`ContentConfig.model`)
    training_queries: Path | None = None  # training_queries.npz (a model that reads queries)
    item_metadata: Path | None = None  # item_metadata.parquet (the enrich step's): `llm_...` text fields read it


@dataclass(frozen=True)
class TrainOutputs:
    model_dir: Path
    model_sha256: str
    # {"valid": {...}, "test": {...}, ["valid_warm", "valid_cold", "test_warm", "test_cold": {...}], timings}
    metrics: dict[str, Any]
    run_id: str | None  # None when tracking is off
    item_vectors: bool  # the model scores by item vectors: an index of them can serve it

    def summary(self) -> dict[str, object]:
        valid, test = self.metrics["valid"], self.metrics["test"]
        return {"model_dir": self.model_dir, "valid_ndcg@10": valid["ndcg@10"], "test_ndcg@10": test["ndcg@10"],
                "test_recall@10": test["recall@10"], "mlflow_run_id": self.run_id}  # fmt: skip


def train_step(
    config: ExperimentConfig, data_dir: Path, out_dir: Path, features: CatalogFeatures | None = None
) -> TrainOutputs:
    """Train `config.model` on `data_dir`, pick the best epoch on validation, test once, save and log.

    Args:
        config: the experiment.
        data_dir: a prepared directory (`recsys data prepare`).
        out_dir: the model directory to write (replaced atomically if it holds an earlier model).
        features: the catalog's semantic IDs and content embeddings, for the models that read them.
    """
    workers = Workers.from_environment()  # of a distributed run, the first process alone tracks and writes
    data = load_prepared(data_dir, config.data.domain)
    torch.manual_seed(config.train.seed)  # the initial weights follow train.seed, not what ran before in the process
    model = build_model(config.model.name, config.model.params, data.num_items, model_inputs(config, data, features))
    tracking = start_tracking(config.tracking, config.experiment_name, config.name) if workers.is_main else None
    with tracking or contextlib.nullcontext(OfflineTracker()) as tracker:
        tracker.log_params({**_logged_config(config), "data_dir": str(data_dir)})
        start = time.perf_counter()
        fitted = _train(model, data, config, tracker, out_dir, data_dir, features)
        valid_split = data.eval_split(VALID)
        kept = "" if fitted is None else f", best epoch {fitted.best_epoch}"  # None: fitted without epochs
        validated = evaluate(model, valid_split, data.num_items, config.eval, workers=workers,
                             what=f"evaluation of {config.model.name} on validation{kept}")  # fmt: skip
        valid = validated.metrics
        test = _test_metrics(model, data, config, workers)
        if not workers.is_main:
            return TrainOutputs(out_dir, "", {VALID: valid, **test}, None, isinstance(model, VectorScorer))
        metrics: dict[str, Any] = {
            VALID: valid,
            **cold_start_slices(VALID, validated.ranks, valid_split, data, config),  # cold-start choices use these
            POPULARITY_VALID: _popularity_valid_metrics(data, config),
            **test,
            **_timings(fitted, time.perf_counter() - start),
        }
        if fitted and fitted.expert_load:
            metrics["expert_load"] = fitted.expert_load  # per epoch: share of routed slots per expert
        for split in (VALID, "valid_warm", "valid_cold", POPULARITY_VALID, TEST, "test_warm", "test_cold"):
            if split in metrics:
                tracker.log_metrics(metrics[split], prefix=f"{split}_")
        tracker.log_metrics({k: float(metrics[k]) for k in ("best_epoch", "train_seconds", "seconds_per_epoch")})
        ranks = PerUserRanks.of(validated.ranks, valid_split)
        write_model_dir(out_dir, config.model_dump(mode="json"), model, data_dir, metrics, valid_ranks=ranks)
        tracker.log_artifacts(out_dir, artifact_path="model_dir")
        tracker.log_model(model)
    logger.info("model written to %s (MLflow run %s)", out_dir, tracker.run_id)
    return TrainOutputs(out_dir, model_sha256(out_dir), metrics, tracker.run_id, isinstance(model, VectorScorer))


def model_inputs(config: ExperimentConfig, data: SequenceData, features: CatalogFeatures | None) -> ModelInputs:
    """What the model is built on: of the catalog's features, its domains and tasks and the trained models the config
    names, what its family reads (`ModelSection.reads`) and nothing else."""
    reads, features = config.model.reads(), features or CatalogFeatures()
    content, texts = None, None
    if Input.CONTENT in reads and features.content_embeddings is not None:
        vectors = torch.from_numpy(read_content_embeddings(features.content_embeddings, data.num_items)).float()
        content = torch.cat([torch.zeros(1, vectors.shape[1]), vectors])  # row 0: the padding item
    if Input.ITEM_TEXTS in reads:  # the texts the content embeddings embed
        items = with_item_metadata(data.items, features.item_metadata).sort(ITEM_IDX)
        texts = tuple(item_texts(items, config.content.text_fields))
    sids = features.semantic_ids if Input.SEMANTIC_IDS in reads else None
    retriever, base = _upstream(config, Input.RETRIEVER), _upstream(config, Input.BASE)
    return ModelInputs(
        semantic_ids=None if sids is None else read_semantic_ids(sids)[0],
        content=content,
        content_encoder=features.content_encoder if Input.CONTENT in reads else None,
        item_texts=texts,
        item_domains=data.item_domains() if Input.DOMAINS in reads and data.domains else None,
        domains=tuple(data.domains) if Input.DOMAINS in reads else (),
        new_items=data.cold_mask if Input.NEW_ITEMS in reads else None,
        item_counts=data.item_counts() if Input.ITEM_COUNTS in reads else None,
        tasks=data.tasks if Input.TASKS in reads else (),
        categories=category_table(data.items) if Input.CATEGORIES in reads else None,
        retriever=retriever[0] if retriever else None,
        extra_retrievers=_upstream(config, Input.EXTRA_RETRIEVERS),
        base=base[0] if base else None,
        members=_upstream(config, Input.MEMBERS),
    )


def _upstream(config: ExperimentConfig, feeds: Input) -> tuple[Upstream, ...]:
    """The trained models the config names for the upstream role that feeds `feeds` (`model.upstream`), frozen, each
    with its family's name."""
    return tuple(Upstream(*load_trained_model(path, key)) for key, path in config.model.upstream_of(feeds))


def _logged_config(config: ExperimentConfig) -> dict[str, Any]:
    """The config as MLflow params, with the model family's training settings in full (defaults included), so runs
    compare on every setting whether or not their files stated it."""
    logged = config.model_dump(mode="json")
    logged["model"]["training"] = config.model.training_record()
    return logged


def training_state_path(out_dir: Path) -> Path:
    """The resumable training state of `out_dir`'s run, kept beside the model directory.

    A re-run with the same settings resumes from it: after a crash it carries on, after a finished run it
    trains nothing, and with a larger epoch count (constant learning rate) or time budget it trains on.
    """
    return out_dir.with_name(f"{out_dir.name}.training-state.dcp")  # a directory: every process writes its part


def compile_cache_file(out_dir: Path) -> Path:
    """The file of what torch.compile made for `out_dir`'s run, beside the model directory: the next run of the same
    model (a retrain, a fresh start, a longer run) loads it (`recsys.training.compile_cache`)."""
    return out_dir.with_name(f"{out_dir.name}.compile-cache.bin")


def compile_cache_path(out_dir: Path, config: ExperimentConfig) -> Path | None:
    """`compile_cache_file(out_dir)` when the run compiles and keeps a cache (`train.hardware.compile_cache`)."""
    hardware = config.train.hardware
    return compile_cache_file(out_dir) if hardware.compile and hardware.compile_cache else None


def _train(
    model: Model[Any],
    data: SequenceData,
    config: ExperimentConfig,
    tracker: Tracker,
    out_dir: Path,
    data_dir: Path,
    features: CatalogFeatures | None,
) -> FitResult | None:
    """Train `model` as its family trains (streaming `data_dir`'s parts with `train.stream_parts`; a student of the
    `distill` section's teacher), its state beside `out_dir`; None for the families without an epoch loop."""
    if training_named(model_family(config.model.name).training).recipe is None:
        if isinstance(model, FitsItemCounts):  # fitted on item counts; any other such model is made of trained ones
            model.fit(data.item_counts())
        return None
    state = training_state_path(out_dir)
    if isinstance(model, TrainsPerDomain):
        if config.distill is not None:
            raise ConfigError("distill: domain adapters train one domain at a time. Fix: distil a sasrec or hstu")
        return _train_per_domain(model, data, config, tracker, state)

    def on_epoch_end(epoch: int, metrics: dict[str, float]) -> None:
        tracker.log_metrics(metrics, prefix="epoch_valid_", step=epoch)

    training: TrainingData = data
    if config.train.stream_parts is not None:
        if model_family(config.model.name).training != "next_item" or config.data.domain is not None:
            raise ConfigError(
                f"train.stream_parts streams the training rows of next-item models on a whole dataset; "
                f"{config.model.name!r}{' on one domain' if config.data.domain else ''} trains in memory. "
                "Fix: remove train.stream_parts"
            )
        training = PreparedParts.open(data_dir, config.train.stream_parts)
    recipe = _recipe(model, training, config, features)
    if config.distill is not None:
        recipe = distillation_recipe(recipe, data, config, out_dir)
    return fit(
        model, training, config.train, config.eval, recipe, on_epoch_end, state, compile_cache_path(out_dir, config)
    )


def _recipe(
    model: Model[Any], data: TrainingData, config: ExperimentConfig, features: CatalogFeatures | None = None
) -> Recipe:
    """The model's recipe on the inputs of it that its family reads."""
    reads, features = config.model.reads(), features or CatalogFeatures()
    holdout = _upstream(config, Input.HOLDOUT_RETRIEVER)
    extra_holdout = tuple(twin.model for twin in _upstream(config, Input.EXTRA_HOLDOUT_RETRIEVERS))
    queries = features.training_queries if Input.QUERIES in reads else None
    bank = None if queries is None else QueryBank.load(queries)
    inputs = RecipeInputs(holdout[0].model if holdout else None, bank, extra_holdout)
    return recipe_for(model, data, config.train.optimization.batch_size, config.model.training_settings(), inputs)


def _train_per_domain(
    model: Model[Any], data: SequenceData, config: ExperimentConfig, tracker: Tracker, state: Path
) -> FitResult:
    """One adapter per domain (or the one of `data.domain`), each trained and early-stopped on its domain's users
    with the base frozen; the result sums the domains' times, keeps the largest best epoch and every domain's best
    validation metrics (keys prefixed with the domain) and the latest epoch at which one diverged."""
    assert isinstance(model, TrainsPerDomain)
    settings = config.model.training_settings()
    full_softmax = isinstance(settings, NextItemTraining) and settings.resolved_loss(data.num_items) == "full_softmax"
    model.check_domain_training(full_softmax, config.train.optimization.weight_decay)
    domains = [config.data.domain] if config.data.domain else data.domains
    results = []
    for domain in domains:

        def on_epoch_end(epoch: int, metrics: dict[str, float], domain: str = domain) -> None:
            tracker.log_metrics(metrics, prefix=f"epoch_valid_{domain}_", step=epoch)

        domain_data = data if config.data.domain else data.for_domain(domain)  # `data` is one domain already
        recipe = _recipe(model, domain_data, config)
        domain_state = state.with_name(f"{state.stem}.{domain}{state.suffix}")
        results.append(fit(model, domain_data, config.train, config.eval, recipe, on_epoch_end, domain_state))
        logger.info("adapter %s: best epoch %d, %s", domain, results[-1].best_epoch, results[-1].best_valid)
    return FitResult(
        best_epoch=max(r.best_epoch for r in results),
        best_valid={f"{d}_{k}": v for d, r in zip(domains, results, strict=True) for k, v in r.best_valid.items()},
        train_seconds=sum(r.train_seconds for r in results),
        epoch_seconds=[s for r in results for s in r.epoch_seconds],
        valid_seconds=[s for r in results for s in r.valid_seconds],
        diverged_epoch=max((r.diverged_epoch for r in results if r.diverged_epoch is not None), default=None),
    )


def _timings(fitted: FitResult | None, seconds: float) -> dict[str, float]:
    if fitted is None:
        return {"best_epoch": 0, "epochs_run": 0, "train_seconds": seconds, "seconds_per_epoch": 0.0,
                "valid_seconds_per_epoch": 0.0}  # fmt: skip
    timings = {
        "best_epoch": fitted.best_epoch,
        "epochs_run": len(fitted.epoch_seconds),
        "train_seconds": fitted.train_seconds,
        "seconds_per_epoch": fitted.seconds_per_epoch,
        "valid_seconds_per_epoch": fitted.valid_seconds_per_epoch,
    }
    firsts = {"time_to_first_step_s": fitted.first_step_seconds,
              "time_to_first_validation_s": fitted.first_validation_seconds}  # fmt: skip
    # none when this attempt trained no epoch (a finished run re-entered)
    timings.update({key: seconds for key, seconds in firsts.items() if seconds is not None})
    if fitted.diverged_epoch is not None:  # the run ended there, with the best validated weights
        timings["diverged_epoch"] = fitted.diverged_epoch
    return timings


def _popularity_valid_metrics(data: SequenceData, config: ExperimentConfig) -> dict[str, float]:
    """The popularity baseline (`recsys.models.popularity`) on the validation split, as the model was validated: the
    bar the champion gate asks every promoted model to beat."""
    popularity = Popularity(PopularityConfig(data.num_items))
    popularity.fit(data.item_counts())
    what = "evaluation of the popularity baseline on validation"
    return evaluate(popularity, data.eval_split(VALID), data.num_items, config.eval, what=what).metrics


def _test_metrics(
    model: Model[Any], data: SequenceData, config: ExperimentConfig, workers: Workers
) -> dict[str, dict[str, float]]:
    """Test metrics; with a cold-start split, also the slices of users whose test target is a cold or a warm item."""
    split = data.eval_split(TEST)
    result = evaluate(model, split, data.num_items, config.eval, workers=workers,
                      what=f"evaluation of {config.model.name} on test")  # fmt: skip
    return {TEST: result.metrics, **cold_start_slices(TEST, result.ranks, split, data, config)}


def cold_start_slices(
    name: str, ranks: torch.Tensor, split: EvalSplit, data: SequenceData, config: ExperimentConfig
) -> dict[str, dict[str, float]]:
    """{"<name>_cold", "<name>_warm"}: the metrics of the users whose target is a cold (warm) item; nothing without a
    cold-start split."""
    cold_targets = data.cold_mask[split.targets]
    if not bool(cold_targets.any()):
        return {}
    return {
        f"{name}_cold": slice_metrics(ranks, cold_targets, config.eval.ks),
        f"{name}_warm": slice_metrics(ranks, ~cold_targets, config.eval.ks),
    }
