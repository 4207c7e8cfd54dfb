"""The champion gate against a real MLflow SQLite registry: every promotion must beat the popularity baseline on
the validation split (the first one included) and, by the strict rule, beat the champion by more than the paired
difference's interval allows (by the point rule: not fall below it by more than the tolerance); the decision gives the
exact values, and with strict the difference, its interval and p-value."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipelines.config import ExperimentConfig, load_config
from pipelines.registry import POINT, GateRule, register_bundle
from pipelines.runner import run_pipeline
from pipelines.steps import PipelineOutputs
from pipelines.tracking import artifact_root
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.evaluation_dir import EVALUATION_FILE
from recsys.artifacts.model_dir import VALID_RANKS_FILE
from recsys.artifacts.per_user import PerUserRanks
from recsys.artifacts.registry import CHAMPION, get_champion
from recsys.data.prepared import load_prepared
from tests.conftest import popularity_valid_metric


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]
) -> tuple[ExperimentConfig, PipelineOutputs]:
    work = tmp_path_factory.mktemp("gate")
    config = load_config(tiny_config(work, pipeline={"index": {"kind": "flat"}}))
    outputs, _ = run_pipeline(config, work)
    return config, outputs


@pytest.fixture
def bundle_with(tmp_path: Path, pipeline: tuple[ExperimentConfig, PipelineOutputs]) -> Callable[..., Bundle]:
    """`bundle_with(valid=v, popularity=p, ranks=edit)`: a bundle of the pipeline's model whose metrics say so
    (popularity None: a model trained before the baseline was measured) and whose per-user validation ranks are
    `edit(the model's)` (None: a model trained before they were kept)."""
    outputs = pipeline[1]
    assert outputs.model is not None

    def write(
        valid: float,
        popularity: float | None,
        ranks: Callable[[PerUserRanks], PerUserRanks | None] = lambda ranks: ranks,
    ) -> Bundle:
        copy = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(outputs.model.model_dir, copy)  # type: ignore[union-attr]
        edited = ranks(PerUserRanks.read(copy / VALID_RANKS_FILE))
        (copy / VALID_RANKS_FILE).unlink()
        if edited is not None:
            edited.write(copy / VALID_RANKS_FILE)
        metrics = json.loads((copy / "metrics.json").read_text())
        metrics["valid"]["ndcg@10"] = valid
        if popularity is None:
            del metrics["popularity_valid"]
        else:
            metrics["popularity_valid"]["ndcg@10"] = popularity
        (copy / "metrics.json").write_text(json.dumps(metrics))
        return Bundle.write(tmp_path / f"bundle-{copy.name}", name="gate", model_dir=copy)

    return write


def test_the_first_champion_beats_the_popularity_baseline_measured_on_the_same_validation_split(
    pipeline: tuple[ExperimentConfig, PipelineOutputs],
) -> None:
    config, outputs = pipeline
    assert outputs.registration is not None and outputs.data is not None and outputs.model is not None
    decision = outputs.registration.decision
    expected = popularity_valid_metric(
        load_prepared(outputs.data.data_dir), config.eval
    )  # measured here, independently
    assert decision.popularity_value == pytest.approx(expected) and decision.value > expected
    assert decision.promoted and decision.reason.startswith("first champion: beats the popularity baseline: ")
    assert decision.popularity_value is not None  # the reason to 4 significant digits, the record exact
    shown = f"validation NDCG@10 {decision.value:#.4g} vs popularity {decision.popularity_value:#.4g} (difference "
    assert shown in decision.reason and repr(decision.value) not in decision.reason

    client = MlflowClient(config.tracking.resolved_uri())
    version = client.get_model_version(config.registered_model_name, decision.version)
    assert float(version.tags["gate.popularity_value"]) == decision.popularity_value
    assert float(version.tags["gate.value"]) == decision.value
    register_run = client.get_run(version.run_id)
    assert register_run.data.metrics["popularity_valid_ndcg_at_10"] == decision.popularity_value
    assert (
        register_run.data.tags["gate.promoted"] == "True" and register_run.data.tags["gate.reason"] == decision.reason
    )
    training_run = client.get_run(outputs.model.run_id)  # type: ignore[arg-type]
    assert training_run.data.metrics["popularity_valid_ndcg_at_10"] == decision.popularity_value
    assert outputs.evaluation is not None
    report = json.loads((outputs.evaluation.evaluation_dir / EVALUATION_FILE).read_text())
    assert report["training"]["metrics"]["popularity_valid"]["ndcg@10"] == decision.popularity_value


def test_a_version_that_does_not_beat_popularity_is_registered_but_never_promoted(
    pipeline: tuple[ExperimentConfig, PipelineOutputs],
    bundle_with: Callable[..., Bundle],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = pipeline[0]
    uri, name, popularity = config.tracking.resolved_uri(), "gate-popularity", 0.1
    with caplog.at_level(logging.INFO, logger="pipelines.registry"):
        untrained = register_bundle(bundle_with(valid=0.02, popularity=popularity), name, uri)
    assert not untrained.promoted and untrained.version == "1" and get_champion(name, uri) is None
    assert untrained.reason == (
        "no champion yet: does not beat the popularity baseline: validation NDCG@10 0.02000 vs popularity 0.1000 "
        "(difference -0.08000)"
    )
    (record,) = [r for r in caplog.records if r.name == "pipelines.registry"]
    assert record.levelno == logging.WARNING and untrained.reason in record.getMessage()
    # a registration outside a pipeline's run keeps its artifacts beside the store, not in the working directory
    experiment = MlflowClient(uri).get_experiment_by_name(name)
    assert experiment.artifact_location == artifact_root(uri)

    assert register_bundle(bundle_with(valid=0.3, popularity=popularity), name, uri).promoted  # v2, champion
    tie = register_bundle(bundle_with(valid=popularity, popularity=popularity), name, uri, GateRule("point", 1.0))
    assert not tie.promoted and tie.reason.startswith("kept the champion: does not beat the popularity baseline")
    client = MlflowClient(uri)
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "2"  # within tolerance, but no better
    assert [client.get_model_version(name, v).tags["gate.promoted"] for v in ("1", "2", "3")] == [
        "False",
        "True",
        "False",
    ]


def test_a_bundle_without_a_baseline_is_not_promoted(
    pipeline: tuple[ExperimentConfig, PipelineOutputs], bundle_with: Callable[..., Bundle]
) -> None:
    uri = pipeline[0].tracking.resolved_uri()
    decision = register_bundle(bundle_with(valid=0.5, popularity=None), "gate-no-baseline", uri)
    assert not decision.promoted and decision.popularity_value is None
    assert decision.reason.endswith("Fix: `recsys pipeline run --rerun train_retriever`")


def test_the_point_gate_keeps_a_worse_version_out_and_promotes_one_within_tolerance(
    pipeline: tuple[ExperimentConfig, PipelineOutputs], bundle_with: Callable[..., Bundle]
) -> None:
    uri, name, point = pipeline[0].tracking.resolved_uri(), "gate-tolerance", GateRule("point", tolerance=0.01)
    assert register_bundle(bundle_with(valid=0.3, popularity=0.1), name, uri).promoted
    worse = register_bundle(bundle_with(valid=0.28, popularity=0.1), name, uri, point)
    assert not worse.promoted and worse.champion_version == "1" and worse.reason.startswith("kept the champion: ")
    assert worse.gate == "point" and worse.paired is None
    close = register_bundle(bundle_with(valid=0.295, popularity=0.1), name, uri, point)
    assert close.promoted and close.champion_value == 0.3
    client = MlflowClient(uri)
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == close.version == "3"


def test_the_gate_gives_4_significant_digits_and_the_difference_of_values_that_round_alike(
    pipeline: tuple[ExperimentConfig, PipelineOutputs],
    bundle_with: Callable[..., Bundle],
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri, name = pipeline[0].tracking.resolved_uri(), "gate-exact"
    assert register_bundle(bundle_with(valid=0.14719845, popularity=0.09604426569761026), name, uri).promoted
    with caplog.at_level(logging.INFO, logger="pipelines.registry"):
        kept = register_bundle(bundle_with(valid=0.1471884, popularity=0.09604426569761026), name, uri, POINT)
    expected = (
        "kept the champion: validation NDCG@10 0.1472 vs champion v1 0.1472 (difference -1.005e-05, tolerance 0.000); "
        "popularity 0.09604"
    )
    assert not kept.promoted and kept.reason == expected  # both read 0.1472: the difference tells them apart
    assert kept.value == 0.1471884 and kept.champion_value == 0.14719845  # the record keeps them exact
    assert f"champion gate for {name} v2: {expected}" in caplog.text


def test_a_popularity_model_is_the_bar_itself_so_it_is_never_promoted(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path, name="tiny-popularity", model={"name": "popularity", "params": {}}))
    outputs, _ = run_pipeline(config, tmp_path)
    assert outputs.registration is not None
    decision = outputs.registration.decision
    assert decision.value == decision.popularity_value  # the same model under the same protocol
    assert not decision.promoted and get_champion(config.registered_model_name, config.tracking.resolved_uri()) is None


def _lift(users: int) -> Callable[[PerUserRanks], PerUserRanks]:
    """Ranks where `users` users whose target was outside the top 10 now have it first (NDCG@10 up by users / U)."""

    def edit(ranks: PerUserRanks) -> PerUserRanks:
        missed = torch.nonzero(ranks.ranks >= 10).squeeze(1)
        assert len(missed) >= users
        lifted = ranks.ranks.clone()
        lifted[missed[:users]] = 0
        return replace(ranks, ranks=lifted)

    return edit


def test_the_strict_gate_promotes_only_a_win_larger_than_its_interval(
    pipeline: tuple[ExperimentConfig, PipelineOutputs],
    bundle_with: Callable[..., Bundle],
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri, name = pipeline[0].tracking.resolved_uri(), "gate-strict"
    assert register_bundle(bundle_with(valid=0.3, popularity=0.1), name, uri).promoted  # v1
    # one more user of 300 with the target first: better on the point estimate, within the noise of 300 users
    with caplog.at_level(logging.INFO, logger="pipelines.registry"):
        close = register_bundle(bundle_with(valid=0.31, popularity=0.1, ranks=_lift(1)), name, uri)
    paired = close.paired
    assert paired is not None and close.gate == "strict" and not close.promoted
    assert paired.difference == pytest.approx(1 / 300) and paired.low <= 0 < paired.high and paired.p_value > 0.05
    assert paired.users == 300 and paired.metric == "ndcg@10"
    assert close.reason.startswith("kept the champion (strict): validation NDCG@10 0.3100 vs champion v1 0.3000; ")
    assert "paired difference +0.003333 (95% interval [+0.000, +0.01000], p " in close.reason
    assert close.reason.endswith("does not win by more than its interval; popularity 0.1000")
    assert f"champion gate for {name} v2: {close.reason}" in caplog.text
    assert register_bundle(bundle_with(valid=0.31, popularity=0.1, ranks=_lift(1)), name, uri, POINT).promoted  # v3

    # 60 users of 300 lifted to the top: a win well past the interval
    clear = register_bundle(bundle_with(valid=0.5, popularity=0.1, ranks=_lift(60)), name, uri)
    assert clear.promoted and clear.paired is not None and clear.paired.low > 0 and clear.paired.p_value < 0.01
    assert clear.reason.startswith("promoted (strict): ") and "wins by more than its interval" in clear.reason
    client = MlflowClient(uri)
    version = client.get_model_version(name, clear.version)
    assert version.tags["gate.gate"] == "strict" and str(clear.paired.p_value) in version.tags["gate.paired"]
    run = client.get_run(version.run_id)
    assert run.data.metrics["gate.difference"] == clear.paired.difference
    assert run.data.metrics["gate.low"] == clear.paired.low and run.data.metrics["gate.p_value"] == clear.paired.p_value
    assert run.data.tags["gate.rule"] == "strict" and run.data.tags["gate.reason"] == clear.reason


def test_the_strict_gate_falls_back_to_the_point_rule_and_says_why(
    pipeline: tuple[ExperimentConfig, PipelineOutputs],
    bundle_with: Callable[..., Bundle],
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri, name = pipeline[0].tracking.resolved_uri(), "gate-fallback"
    assert register_bundle(bundle_with(valid=0.3, popularity=0.1, ranks=lambda ranks: None), name, uri).promoted
    with caplog.at_level(logging.WARNING, logger="pipelines.registry"):
        old_champion = register_bundle(bundle_with(valid=0.31, popularity=0.1), name, uri)
    assert old_champion.promoted and old_champion.gate == "point" and old_champion.paired is None
    why = "champion v1's bundle keeps no per-user validation ranks (trained before they were kept; "
    assert old_champion.reason.startswith(f"promoted (strict rule not applicable: {why}")
    assert f"strict rule not applicable, point rule instead: {why}" in caplog.text

    def other_targets(ranks: PerUserRanks) -> PerUserRanks:
        return replace(ranks, targets=ranks.targets + 1)

    other_users = register_bundle(bundle_with(valid=0.30, popularity=0.1, ranks=other_targets), name, uri)
    assert not other_users.promoted and other_users.gate == "point"
    assert "champion v2 was validated on other users or targets (other data)" in other_users.reason
