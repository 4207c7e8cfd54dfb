"""Model bundles (`recsys.artifacts.bundle`) in the MLflow model registry, and the champion gate.

`register_bundle` logs a bundle as the artifacts of an MLflow run, creates a new version of the registered model,
and moves the alias `champion` to it only when its validation NDCG@10 beats the popularity baseline's on the same
validation split (every promotion, the first included) and wins against the current champion by the gate's rule
(`GateRule`, docs/pipelines.md):

    strict   the paired difference of validation NDCG@10 (new minus champion, per user, on the same validation users)
             must have its whole interval above 0: the new version is better by more than the interval allows. When
             the pairing is impossible (a bundle without per-user validation ranks, or validated on other users) the
             gate says why and applies the point rule.
    point    the new value is not below the champion's by more than `tolerance` (point estimates only)

The decision is logged and kept as tags of the new version (its reason gives every number to 4 significant digits;
the values themselves, exact, beside it) and as metrics of its run (exact; with strict, the difference, its interval
and p-value).
Reading the registry (the champion, its bundle) is the library's: `recsys.artifacts.registry`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import TypeAdapter

from pipelines.tracking import artifact_root, store_lock
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import VALID_RANKS_FILE
from recsys.artifacts.per_user import PerUserRanks
from recsys.artifacts.registry import CHAMPION, GATE_METRIC, PROMOTED_TAG, champion_record, download_bundle
from recsys.evaluation.uncertainty import PairedDifference, Uncertainty, paired_difference, per_user_metrics

logger = logging.getLogger(__name__)

POPULARITY_METRIC = "popularity_valid_ndcg_at_10"  # the bar: the popularity baseline on the same validation split
GATE_K = 10  # the gate's metric is NDCG@GATE_K
GateMode = Literal["strict", "point"]
REGISTRATION_TAG = "recsys.registration"  # a version's tag: what identifies its registration (`registration_key`)
DECISION_TAG = "gate.decision"  # a version's tag: its gate decision as JSON, written last (the decision is recorded)
DESCRIPTION = "recsys model bundles (pipelines/registry.py)"


@dataclass(frozen=True)
class GateRule:
    """How a new version must compare with the champion (`pipeline.registry` of a config)."""

    mode: GateMode = "strict"
    tolerance: float = 0.0  # point: how far below the champion's value a new version may be
    uncertainty: Uncertainty = field(default_factory=Uncertainty)  # strict: the paired test's resamples, confidence


POINT = GateRule(mode="point")


@dataclass(frozen=True)
class GateDecision:
    """Whether version `version` of `model_name` became the champion, and why."""

    model_name: str
    version: str
    promoted: bool
    value: float  # the new version's validation NDCG@10
    popularity_value: float | None  # the popularity baseline's (None: the bundle predates the baseline)
    champion_version: str | None  # the champion it was compared with (None: there was none)
    champion_value: float | None
    tolerance: float
    reason: str
    gate: GateMode = "point"  # the rule applied (strict falls back to point when it cannot pair; the reason says why)
    paired: PairedDifference | None = None  # strict: new minus champion, per user, with its interval and p-value


def register_bundle(bundle: Bundle, model_name: str, tracking_uri: str, gate: GateRule | None = None) -> GateDecision:
    """Log the bundle to MLflow, register it as a new version of `model_name`, and apply the champion gate (`gate`,
    strict by default).

    Runs inside the active MLflow run when there is one (as a nested run), else in a run of its own in the experiment
    named after the registered model (in this store: an experiment another store's run left active does not count).

    Idempotent: a version is tagged with what identifies its registration (`registration_key`: the bundle's content
    and the gate's rule), and registering the same again finishes that version instead of creating another, the one
    a process killed mid-registration left included: the gate is applied to it when its decision was not recorded,
    else the recorded decision is returned (and its promotion completed when the kill came before it).
    """
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    rule = gate or GateRule()
    registration = registration_key(bundle, rule)
    value, popularity = bundle.validation_ndcg_at_10, bundle.popularity_validation_ndcg_at_10
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    nested = mlflow.active_run() is not None
    experiment = None if nested else _experiment_id(client, model_name, tracking_uri)
    with mlflow.start_run(run_name=f"register {model_name}", nested=nested, experiment_id=experiment) as run:
        logged = _registered(client, model_name, registration) is None  # else the run that registered it logged it
        if logged:
            mlflow.log_artifacts(str(bundle.path), artifact_path="bundle")
        mlflow.log_metrics({GATE_METRIC: value, **({} if popularity is None else {POPULARITY_METRIC: popularity})})
        with store_lock(tracking_uri):  # one registration at a time: two must not both create the model or promote
            found = _registered(client, model_name, registration)
            if found is None:
                if not logged:  # the version seen before the lock is gone (deleted meanwhile)
                    mlflow.log_artifacts(str(bundle.path), artifact_path="bundle")
                try:
                    client.get_registered_model(model_name)
                except MlflowException:
                    client.create_registered_model(model_name, description=DESCRIPTION)
                # one transaction: the version never exists without the tag that finds it again
                version = str(client.create_model_version(
                    model_name, source=f"{run.info.artifact_uri}/bundle", run_id=run.info.run_id,
                    tags={GATE_METRIC: str(value), REGISTRATION_TAG: registration},
                ).version)  # fmt: skip
                decision = None
            else:
                version, decision = str(found.version), recorded_decision(found)
                logger.info("%s v%s is this registration (the same bundle and gate), made before: finishing it, %s",
                            model_name, version, "gate decided" if decision else "gate not applied yet")  # fmt: skip
            # Every kill point is safe because of this order: (1) the version, with its key; (2) the decision's tags,
            # DECISION_TAG last: it marks the decision recorded; (3) the champion alias. Killed before (2) ends, the
            # version has no recorded decision and cannot be champion: the next registration applies the gate to it
            # (against the champion of then, never itself). Killed between (2) and (3), or after (3), the decision
            # stands: the next one returns it and sets the alias if it is still due (`_promote`). So the alias never
            # points at a version whose decision was not recorded.
            if decision is None:
                decision = _gate(client, bundle, model_name, version, tracking_uri, rule)
                _record(client, decision)
            _promote(client, decision)
        mlflow.set_tags(
            {PROMOTED_TAG: str(decision.promoted), "gate.reason": decision.reason, "gate.rule": decision.gate}
        )
        if decision.paired is not None:
            mlflow.log_metrics({f"gate.{key}": value for key, value in decision.paired.to_dict().items()})
        mlflow.log_dict(asdict(decision), "gate_decision.json")
    level = logging.INFO if decision.promoted else logging.WARNING
    logger.log(level, "champion gate for %s v%s: %s", model_name, version, decision.reason)
    return decision


def registration_key(bundle: Bundle, rule: GateRule) -> str:
    """What identifies a registration: SHA-256 of the bundle's content (`Bundle.content_sha256`: its creation time
    aside, so the same step's bundle assembled again after a crash is the same) and of the gate's rule (the same
    bundle under another rule is another decision). Kept as the version's tag `REGISTRATION_TAG`."""
    what = {"bundle": bundle.content_sha256(), "gate": asdict(rule)}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def recorded_decision(version: Any) -> GateDecision | None:
    """The gate's decision recorded on a version (an MLflow `ModelVersion`), or None: not recorded (yet)."""
    recorded = version.tags.get(DECISION_TAG)
    return None if recorded is None else TypeAdapter(GateDecision).validate_python(json.loads(recorded))


def _registered(client: Any, model_name: str, key: str) -> Any | None:
    """The version of `model_name` registered under `key` (the first, should there be several), or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{model_name}' and tags.`{REGISTRATION_TAG}` = '{key}'")
    except MlflowException:  # no such model yet
        return None
    return min(found, key=lambda v: int(v.version), default=None)


def _gate(
    client: Any, bundle: Bundle, model_name: str, version: str, tracking_uri: str, rule: GateRule
) -> GateDecision:
    """The champion gate's decision on version `version` (the bundle's) against the current champion."""
    champion = champion_record(client, model_name)
    paired = None
    if champion is not None and rule.mode == "strict":
        paired = _paired(bundle, champion, tracking_uri, rule.uncertainty)
        if isinstance(paired, str):
            logger.warning("champion gate for %s: strict rule not applicable, point rule instead: %s",
                           model_name, paired)  # fmt: skip
    value, popularity = bundle.validation_ndcg_at_10, bundle.popularity_validation_ndcg_at_10
    return _decide(model_name, version, value, popularity, champion, rule, paired)


def _record(client: Any, decision: GateDecision) -> None:
    """The decision as tags of its version: each field (`gate.FIELD`), then the whole (`DECISION_TAG`), last."""
    fields = asdict(decision)
    for key, tag in fields.items():
        client.set_model_version_tag(decision.model_name, decision.version, f"gate.{key}", str(tag))
    client.set_model_version_tag(decision.model_name, decision.version, DECISION_TAG, json.dumps(fields))


def _promote(client: Any, decision: GateDecision) -> None:
    """Move the champion alias to a promoted version, unless it is there already or another version was promoted
    since the decision (the champion is no longer the one it was compared with: a later gate has decided)."""
    if not decision.promoted:
        return
    champion = champion_record(client, decision.model_name)
    current = None if champion is None else str(champion.version)
    if current == decision.version:
        return
    if current != decision.champion_version:
        logger.warning("champion gate for %s v%s: promoted against %s, but v%s was promoted since: the alias stays",
                       decision.model_name, decision.version,
                       "no champion" if decision.champion_version is None else f"v{decision.champion_version}",
                       current)  # fmt: skip
        return
    client.set_registered_model_alias(decision.model_name, CHAMPION, decision.version)


def _experiment_id(client: Any, name: str, tracking_uri: str) -> str:
    """The experiment of registrations outside a pipeline's run, created with its artifacts beside a SQLite store
    (MLflow's default would be ./mlruns of whatever directory the process runs in)."""
    with store_lock(tracking_uri):  # two first registrations must not both create it
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        return str(client.create_experiment(name, artifact_location=artifact_root(tracking_uri)))


def _paired(bundle: Bundle, champion: Any, tracking_uri: str, uncertainty: Uncertainty) -> PairedDifference | str:
    """The strict rule's paired difference of validation NDCG@10, new minus champion, over the same users; or why it
    cannot be made (the point rule then applies)."""
    champion_ranks = download_bundle(str(champion.source), tracking_uri).model_dir / VALID_RANKS_FILE
    new_ranks = bundle.model_dir / VALID_RANKS_FILE
    for who, ranks in (("the new version", new_ranks), (f"champion v{champion.version}", champion_ranks)):
        if not ranks.is_file():
            return (f"{who}'s bundle keeps no per-user validation ranks (trained before they were kept; "
                    "`recsys pipeline run --rerun train_retriever` keeps them)")  # fmt: skip
    new, old = PerUserRanks.read(new_ranks), PerUserRanks.read(champion_ranks)
    if new.split_digest != old.split_digest:
        return (f"champion v{champion.version} was validated on other users or targets (other data): a paired "
                "test needs the same validation split")  # fmt: skip
    names, values = per_user_metrics(new.ranks, (GATE_K,))
    column = names.index(f"ndcg@{GATE_K}")
    old_values = per_user_metrics(old.ranks, (GATE_K,))[1]
    return paired_difference(values[:, [column]], old_values[:, [column]], [names[column]], uncertainty)[0]


def _decide(
    model_name: str,
    version: str,
    value: float,
    popularity: float | None,
    champion: Any | None,
    rule: GateRule,
    paired: PairedDifference | str | None,
) -> GateDecision:
    """Promote when `value` beats `popularity` and wins against the champion by `rule` (strict: `paired`, the
    difference with its interval, or why there is none; the point rule then decides, and the reason says why).

    The reason gives the values and their difference to 4 significant digits (`_figure`): two values that round
    alike still show a difference; the decision's fields keep them exact.
    """
    champion_version = None if champion is None else str(champion.version)
    champion_value = None if champion is None else float(champion.tags[GATE_METRIC])
    strict = paired if isinstance(paired, PairedDifference) else None

    def decision(promoted: bool, reason: str) -> GateDecision:
        return GateDecision(model_name, version, promoted, value, popularity, champion_version, champion_value,
                            rule.tolerance, reason, "strict" if strict else "point", strict)  # fmt: skip

    kept = "kept the champion" if champion is not None else "no champion yet"
    if popularity is None:
        fix = "Fix: `recsys pipeline run --rerun train_retriever`"
        return decision(False, f"{kept}: the bundle records no popularity baseline to beat (its model was trained "
                               f"before the gate required one). {fix}")  # fmt: skip
    against_popularity = (
        f"validation NDCG@10 {_figure(value)} vs popularity {_figure(popularity)} ({_difference(value, popularity)})"
    )
    if not value > popularity:
        return decision(False, f"{kept}: does not beat the popularity baseline: {against_popularity}")
    if champion_value is None:
        return decision(True, f"first champion: beats the popularity baseline: {against_popularity}")
    against_champion = f"validation NDCG@10 {_figure(value)} vs champion v{champion_version} {_figure(champion_value)}"
    if strict is not None:
        promoted = strict.low > 0
        verdict = "promoted" if promoted else "kept the champion"
        return decision(
            promoted,
            f"{verdict} (strict): {against_champion}; {describe(strict, rule.uncertainty.confidence)}: "
            f"{'wins' if promoted else 'does not win'} by more than its interval; popularity {_figure(popularity)}",
        )
    promoted = value >= champion_value - rule.tolerance
    verdict = "promoted" if promoted else "kept the champion"
    fallback = f" (strict rule not applicable: {paired})" if isinstance(paired, str) else ""
    return decision(
        promoted,
        f"{verdict}{fallback}: {against_champion} ({_difference(value, champion_value)}, "
        f"tolerance {_figure(rule.tolerance)}); popularity {_figure(popularity)}",
    )


def describe(paired: PairedDifference, confidence: float = 0.95) -> str:
    """A paired difference in words, e.g. "paired difference +0.0012 (95 % interval [-0.0003, +0.0027], p 0.12,
    21,000 users)"."""
    return (f"paired difference {_figure(paired.difference, '+')} ({confidence:.0%} interval "
            f"[{_figure(paired.low, '+')}, {_figure(paired.high, '+')}], p {paired.p_value:.3g}, "
            f"{paired.users:,} users)")  # fmt: skip


def _difference(value: float, other: float) -> str:
    return f"difference {_figure(value - other, '+')}"


def _figure(value: float, sign: str = "") -> str:
    """A metric as the gate's reason gives it: 4 significant digits, trailing zeros kept, e.g. 0.2702, 0.3900 or
    0.09604 ("+" for a difference)."""
    return f"{value:{sign}#.4g}"
