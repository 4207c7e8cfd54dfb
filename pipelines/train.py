"""Pipeline step: prepared data + experiment config -> trained model directory, tracked in MLflow."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pipelines.config import ExperimentConfig
from pipelines.model_dir import write_model_dir
from pipelines.tracking import Tracker, start_tracking
from recsys.data.prepared import SequenceData, load_prepared
from recsys.data.schema import TEST, VALID
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig, evaluate
from recsys.evaluation.slices import slice_metrics
from recsys.models.domain_adapters import DomainAdaptedRetriever
from recsys.models.fusion import Fusion
from recsys.models.generative import GenerativeRetriever
from recsys.models.popularity import Popularity
from recsys.models.registry import Model, build_model
from recsys.training.trainer import FitResult, fit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOutputs:
    model_dir: Path
    metrics: dict[str, Any]  # {"valid": {...}, "test": {...}, ["test_warm", "test_cold": {...}], timings}
    run_id: str | None  # None when tracking is off


def train_step(config: ExperimentConfig, data_dir: Path, out_dir: Path) -> TrainOutputs:
    """Train `config.model` on `data_dir`, pick the best epoch on validation, test once, save and log.

    Args:
        config: the experiment.
        data_dir: a prepared directory (`recsys data prepare`).
        out_dir: the model directory to write (replaced atomically if it holds an earlier model).
    """
    data = load_prepared(data_dir)
    model = build_model(config.model.name, config.model.params, data.num_items)
    if isinstance(model, GenerativeRetriever):
        model.mark_new_items(data.cold_mask)  # cold-start items: served through `new_item_slots`, if any
    eval_config = eval_config_for(config, model)
    with start_tracking(config.tracking, config.experiment_name, config.name) as tracker:
        tracker.log_params({**config.model_dump(mode="json"), "data_dir": str(data_dir)})
        start = time.perf_counter()
        fitted = _fit(model, data, config, eval_config, tracker, training_state_path(out_dir))
        metrics: dict[str, Any] = {
            VALID: evaluate(model, data.eval_split(VALID), data.num_items, eval_config).metrics,
            **_test_metrics(model, data, eval_config),
            "best_epoch": fitted.best_epoch if fitted else 0,
            "epochs_run": len(fitted.epoch_seconds) if fitted else 0,
            "train_seconds": fitted.train_seconds if fitted else time.perf_counter() - start,
            "seconds_per_epoch": fitted.seconds_per_epoch if fitted else 0.0,
            "valid_seconds_per_epoch": fitted.valid_seconds_per_epoch if fitted else 0.0,
        }
        if fitted and fitted.expert_load:
            metrics["expert_load"] = fitted.expert_load  # per epoch: share of routed slots per expert
        for split in (VALID, TEST, "test_warm", "test_cold"):
            if split in metrics:
                tracker.log_metrics(metrics[split], prefix=f"{split}_")
        tracker.log_metrics({k: float(metrics[k]) for k in ("best_epoch", "train_seconds", "seconds_per_epoch")})
        write_model_dir(out_dir, config, model, data_dir, metrics)
        tracker.log_artifacts(out_dir, artifact_path="model_dir")
        tracker.log_model(model)
    logger.info("model written to %s (MLflow run %s)", out_dir, tracker.run_id)
    return TrainOutputs(model_dir=out_dir, metrics=metrics, run_id=tracker.run_id)


def eval_config_for(config: ExperimentConfig, model: Model) -> EvalConfig:
    """The experiment's evaluation settings, feeding the model as much history as it reads."""
    max_len = getattr(model.config, "max_len", config.eval.max_history)
    return EvalConfig(**{**asdict(config.eval), "max_history": max_len})


def training_state_path(out_dir: Path) -> Path:
    """The resumable training state of `out_dir`'s run, kept beside the model directory.

    A re-run with the same settings resumes from it: after a crash it carries on, after a finished run it
    trains nothing, and with a larger epoch count (constant learning rate) or time budget it trains on.
    """
    return out_dir.with_name(f"{out_dir.name}.training-state.pt")


def _fit(
    model: Model,
    data: SequenceData,
    config: ExperimentConfig,
    eval_config: EvalConfig,
    tracker: Tracker,
    state_path: Path,
) -> FitResult | None:
    if isinstance(model, Popularity):
        model.fit(data.item_counts())
        return None
    if isinstance(model, Fusion):  # its members are trained already
        return None

    if isinstance(model, DomainAdaptedRetriever):
        return _fit_domain_adapters(model, data, config, eval_config, tracker, state_path)

    def on_epoch_end(epoch: int, metrics: dict[str, float]) -> None:
        tracker.log_metrics(metrics, prefix="epoch_valid_", step=epoch)

    return fit(model, data, config.train, eval_config, on_epoch_end=on_epoch_end, state_path=state_path)


def _fit_domain_adapters(
    model: DomainAdaptedRetriever,
    data: SequenceData,
    config: ExperimentConfig,
    eval_config: EvalConfig,
    tracker: Tracker,
    state_path: Path,
) -> FitResult:
    """One adapter per domain, each trained (and early-stopped) on its domain's users with the base frozen; the
    result sums the domains' times, keeps the largest best epoch and every domain's best validation metrics
    (keys prefixed with the domain)."""
    if list(model.config.domains) != data.domains:
        raise ConfigError(
            f"model.params.domains={list(model.config.domains)} but the data's domains are {data.domains}. "
            f"Fix: set domains: {data.domains}"
        )
    train = config.train
    if model.config.embedding_rank and (train.loss != "full_softmax" or train.weight_decay):
        raise ConfigError(
            f"item adapters (model.params.embedding_rank={model.config.embedding_rank}) share one table of item rows "
            f"across domains: training a domain must leave the others' rows alone, which needs train.loss: "
            f"full_softmax and train.weight_decay: 0 (got {train.loss!r}, {train.weight_decay}). Fix: set those, "
            "or embedding_rank: 0"
        )
    with torch.no_grad():
        model.item_domain.copy_(data.item_domains())
    results = []
    for domain in data.domains:

        def on_epoch_end(epoch: int, metrics: dict[str, float], domain: str = domain) -> None:
            tracker.log_metrics(metrics, prefix=f"epoch_valid_{domain}_", step=epoch)

        domain_state = state_path.with_name(f"{state_path.stem}.{domain}.pt")
        domain_data = data.for_domain(domain)
        results.append(fit(model, domain_data, config.train, eval_config, on_epoch_end, state_path=domain_state))
        logger.info("adapter %s: best epoch %d, %s", domain, results[-1].best_epoch, results[-1].best_valid)
    return FitResult(
        best_epoch=max(r.best_epoch for r in results),
        best_valid={f"{d}_{k}": v for d, r in zip(data.domains, results, strict=True) for k, v in r.best_valid.items()},
        train_seconds=sum(r.train_seconds for r in results),
        epoch_seconds=[s for r in results for s in r.epoch_seconds],
        valid_seconds=[s for r in results for s in r.valid_seconds],
    )


def _test_metrics(model: Model, data: SequenceData, eval_config: EvalConfig) -> dict[str, dict[str, float]]:
    """Test metrics; with a cold-start split, also the slice of users whose test target is a cold item."""
    split = data.eval_split(TEST)
    result = evaluate(model, split, data.num_items, eval_config)
    out = {TEST: result.metrics}
    cold_targets = data.cold_mask[split.targets]
    if bool(cold_targets.any()):
        out["test_cold"] = slice_metrics(result.ranks, cold_targets, eval_config.ks)
        out["test_warm"] = slice_metrics(result.ranks, ~cold_targets, eval_config.ks)
    return out
