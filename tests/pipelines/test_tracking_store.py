"""Where MLflow's store lives when no one names one: in the work dir (`WORK/mlflow.db`, artifacts in
`WORK/mlartifacts/`), never in the directory a command is started from; `tracking.uri` and $MLFLOW_TRACKING_URI still
name another."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.tracking import TrackingSection
from recsys.artifacts.registry import default_tracking_uri, get_champion, resolve_tracking_uri


def test_the_default_store_is_the_work_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "work"
    assert default_tracking_uri(work) == f"sqlite:///{work.resolve()}/mlflow.db"
    assert TrackingSection().under(work).uri == default_tracking_uri(work) == resolve_tracking_uri(None, work)
    assert TrackingSection(uri="sqlite:////srv/x.db").under(work).uri == "sqlite:////srv/x.db"  # as given
    assert TrackingSection(enabled=False).under(work).uri is None  # off: nothing to name
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg2://mlflow@db:5432/mlflow")
    assert TrackingSection().under(work).uri == "postgresql+psycopg2://mlflow@db:5432/mlflow"


def test_a_pipeline_run_writes_its_store_into_the_work_dir_not_the_current_one(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    """The real `recsys pipeline run --work-dir W` from another directory, tracking on and no URI named: the store
    and its artifacts are W's, the directory it ran in is left empty, and the champion is found in W's store."""
    config = tiny_config(tmp_path, train={"schedule": {"epochs": 1}})
    here, work = tmp_path / "here", tmp_path / "work"
    here.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    command = [str(Path(sys.executable).with_name("recsys")), "pipeline", "run", "--config", str(config),
               "--work-dir", str(work), "--set", "tracking.uri=null"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=here, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(here.iterdir()) == []  # no mlruns.db, mlflow.db or mlartifacts/ where it was started
    assert (work / "mlflow.db").is_file() and any((work / "mlartifacts").iterdir())
    champion = get_champion("tiny-sasrec", default_tracking_uri(work))
    assert champion is not None and champion.source.startswith((work / "mlartifacts").resolve().as_uri())
