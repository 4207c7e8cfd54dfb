"""Registration is idempotent under kill -9 at any point, with real processes and a real MLflow SQLite store: a child
process registers a bundle and dies abruptly (os._exit(137), or SIGKILL) right before or after an MLflow call; the
same registration run again finishes the version the killed one created (one version of the bundle, its gate decision
recorded, the champion alias right) and never compares the bundle with itself. The death point is injected by the
child's script, which wraps an `MlflowClient` method: nothing in the product knows of it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from pipelines.config import load_config
from pipelines.registry import DECISION_TAG, POINT, REGISTRATION_TAG, GateRule, register_bundle, registration_key
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.registry import CHAMPION
from tests.conftest import train_experiment

ROOT = Path(__file__).resolve().parents[2]
DIE = "RECSYS_TEST_DIE"  # METHOD:before|after:N[:sigkill]: die at the Nth call of MlflowClient.METHOD

# Installs the death point of $RECSYS_TEST_DIE, then runs what follows it.
DEATH = f"""
import os, signal
from mlflow.tracking import MlflowClient

method, when, nth, *how = os.environ["{DIE}"].split(":")
original, calls = getattr(MlflowClient, method), []

def die():
    if how == ["sigkill"]:
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)

def wrapped(self, *args, **kwargs):
    calls.append(1)
    last = len(calls) == int(nth)
    if last and when == "before":
        die()
    result = original(self, *args, **kwargs)
    if last and when == "after":
        die()
    return result

setattr(MlflowClient, method, wrapped)
"""

REGISTER = """
import json, sys
from pipelines.registry import GateRule, register_bundle
from recsys.artifacts.bundle import Bundle

bundle, name, uri, rule = sys.argv[1:]
register_bundle(Bundle(__import__("pathlib").Path(bundle)), name, uri, GateRule(**json.loads(rule)))
raise SystemExit("registered: the death point was never reached")
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> Path:
    work = tmp_path_factory.mktemp("killed-register")
    return train_experiment(load_config(tiny_config(work)), work).model_dir


@pytest.fixture
def bundle_with(tmp_path: Path, model_dir: Path) -> Callable[[float], Bundle]:
    """`bundle_with(valid)`: a bundle of the tiny model whose validation NDCG@10 says `valid` (popularity 0.1)."""

    def write(valid: float) -> Bundle:
        copy = tmp_path / f"model-{valid}"
        shutil.copytree(model_dir, copy)
        metrics = json.loads((copy / "metrics.json").read_text())
        metrics["valid"]["ndcg@10"], metrics["popularity_valid"]["ndcg@10"] = valid, 0.1
        (copy / "metrics.json").write_text(json.dumps(metrics))
        return Bundle.write(tmp_path / f"bundle-{valid}", name="killed", model_dir=copy)

    return write


def _die_during(script: str, death: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), DIE: death}
    return subprocess.run(
        [sys.executable, "-c", DEATH + script, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def _register_killed(bundle: Bundle, name: str, uri: str, rule: GateRule, death: str, cwd: Path) -> None:
    rule_json = json.dumps({"mode": rule.mode, "tolerance": rule.tolerance})
    child = _die_during(REGISTER, death, str(bundle.path), name, uri, rule_json, cwd=cwd)
    assert child.returncode == 137, child.stderr[-3000:]


def _versions(client: MlflowClient, name: str) -> dict[str, Any]:
    return {str(v.version): v for v in client.search_model_versions(f"name = '{name}'")}


def _champion(client: MlflowClient, name: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except Exception:
        return None


def _check_the_alias_points_at_a_decided_version(client: MlflowClient, name: str) -> None:
    champion = _champion(client, name)
    assert champion is None or DECISION_TAG in _versions(client, name)[champion].tags


# (where it dies, the versions it leaves: 1 = the champion alone, the alias then, whether the rerun finds the gate's
# decision already recorded)
KILL_POINTS = {
    "before the version is created": ("create_model_version:before:1", 1, "1", False),
    "after the version is created": ("create_model_version:after:1", 2, "1", False),
    "amid the decision's tags": ("set_model_version_tag:after:3", 2, "1", False),
    "after the decision, before the alias": ("set_registered_model_alias:before:1", 2, "1", True),
    "after the alias is set": ("set_registered_model_alias:after:1", 2, "2", True),
}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_registration_killed_at_any_point_is_finished_by_the_next_one_without_a_second_version(
    tmp_path: Path, bundle_with: Callable[[float], Bundle], point: str, caplog: pytest.LogCaptureFixture
) -> None:
    death, versions_left, alias_left, decided = KILL_POINTS[point]
    uri, name = f"sqlite:///{tmp_path / 'mlflow.db'}", "killed"
    client = MlflowClient(uri)
    assert register_bundle(bundle_with(0.3), name, uri, POINT).promoted  # v1, the champion the new one must beat

    better = bundle_with(0.4)
    _register_killed(better, name, uri, POINT, death, tmp_path)
    left = _versions(client, name)
    assert len(left) == versions_left and _champion(client, name) == alias_left  # it died where it was meant to
    assert (DECISION_TAG in left["2"].tags) is decided if versions_left == 2 else True
    _check_the_alias_points_at_a_decided_version(client, name)

    again = Bundle.write(tmp_path / "again", name="killed", model_dir=better.model_dir)  # assembled again, as a rerun
    with caplog.at_level(logging.INFO, logger="pipelines.registry"):
        decision = register_bundle(again, name, uri, POINT)
    versions = _versions(client, name)
    assert sorted(versions) == ["1", "2"] and decision.version == "2"  # one version of the bundle, no duplicate
    assert decision.promoted and decision.champion_version == "1"  # compared with v1, never with itself
    assert _champion(client, name) == "2"
    tags = versions["2"].tags
    assert json.loads(tags[DECISION_TAG])["reason"] == decision.reason == tags["gate.reason"]
    assert tags[REGISTRATION_TAG] == registration_key(better, POINT)
    resumed = "gate decided" if decided else "gate not applied yet"
    assert (f"killed v2 is this registration (the same bundle and gate), made before: finishing it, {resumed}"
            in caplog.text) is (versions_left == 2)  # fmt: skip


def test_a_killed_registration_the_gate_keeps_out_is_decided_once_and_never_promoted(
    tmp_path: Path, bundle_with: Callable[[float], Bundle]
) -> None:
    uri, name = f"sqlite:///{tmp_path / 'mlflow.db'}", "killed"
    client = MlflowClient(uri)
    assert register_bundle(bundle_with(0.3), name, uri, POINT).promoted
    worse = bundle_with(0.2)
    _register_killed(worse, name, uri, POINT, "set_model_version_tag:before:1", tmp_path)
    decision = register_bundle(worse, name, uri, POINT)
    assert not decision.promoted and decision.version == "2" and decision.champion_version == "1"
    assert sorted(_versions(client, name)) == ["1", "2"] and _champion(client, name) == "1"
    assert register_bundle(worse, name, uri, POINT) == decision  # once decided, the decision is returned as recorded
    assert sorted(_versions(client, name)) == ["1", "2"]


def test_a_recorded_promotion_does_not_take_the_alias_back_from_a_champion_promoted_since(
    tmp_path: Path, bundle_with: Callable[[float], Bundle], caplog: pytest.LogCaptureFixture
) -> None:
    uri, name = f"sqlite:///{tmp_path / 'mlflow.db'}", "killed"
    client = MlflowClient(uri)
    assert register_bundle(bundle_with(0.3), name, uri, POINT).promoted  # v1
    killed = bundle_with(0.4)
    _register_killed(killed, name, uri, POINT, "set_registered_model_alias:before:1", tmp_path)  # v2: decided
    assert register_bundle(bundle_with(0.5), name, uri, POINT).version == _champion(client, name) == "3"
    with caplog.at_level(logging.WARNING, logger="pipelines.registry"):
        decision = register_bundle(killed, name, uri, POINT)
    assert decision.version == "2" and decision.promoted and decision.champion_version == "1"  # as recorded
    assert _champion(client, name) == "3" and sorted(_versions(client, name)) == ["1", "2", "3"]
    assert "killed v2: promoted against v1, but v3 was promoted since: the alias stays" in caplog.text


def test_a_registration_is_the_bundle_content_and_the_gate_rule(
    tmp_path: Path, bundle_with: Callable[[float], Bundle]
) -> None:
    uri, name = f"sqlite:///{tmp_path / 'mlflow.db'}", "same"
    bundle = bundle_with(0.3)
    again = Bundle.write(tmp_path / "again", name="killed", model_dir=bundle.model_dir)
    assert again.content_sha256() == bundle.content_sha256() != bundle_with(0.31).content_sha256()
    first = register_bundle(bundle, name, uri, POINT)
    assert register_bundle(again, name, uri, POINT) == first  # the same again: no second version
    strict = register_bundle(again, name, uri, GateRule())  # another rule: another registration, compared with v1
    assert strict.version == "2" and strict.champion_version == "1" and strict.gate == "strict" and not strict.promoted


def test_a_pipeline_killed_during_register_registers_once_when_run_again(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    path = tiny_config(tmp_path, pipeline={"index": {"kind": "flat"}})
    work = tmp_path / "work"
    run = (
        f"import sys; sys.argv = ['recsys', 'pipeline', 'run', '--config', {str(path)!r}, '--work-dir', {str(work)!r}]"
    )
    child = _die_during(
        run + "\nfrom cli import app\napp()\n", "set_registered_model_alias:after:1:sigkill", cwd=tmp_path
    )
    assert child.returncode == -9, child.stderr[-3000:]

    config = load_config(path)
    client = MlflowClient(config.tracking.under(work).resolved_uri())
    name = config.registered_model_name
    assert sorted(_versions(client, name)) == ["1"] and _champion(client, name) == "1"  # killed after the alias
    outputs, reports = run_pipeline(config, work)
    assert {r.name: r.status for r in reports}["register"] == "ran"
    assert outputs.registration is not None
    decision = outputs.registration.decision
    assert decision.version == "1" and decision.promoted and decision.champion_version is None
    assert sorted(_versions(client, name)) == ["1"] and _champion(client, name) == "1"
