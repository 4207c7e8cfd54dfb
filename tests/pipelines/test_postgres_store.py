"""The pipeline against a real PostgreSQL MLflow store (127.0.0.1:5432): runs, registry, champion alias.

Skips when no server answers, except under CI=true, where a missing server is a failure (CI machines run one).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from mlflow.tracking import MlflowClient

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.registry import CHAMPION, get_champion
from recsys.dashboard import from_mlflow

HOST, PORT, USER = "127.0.0.1", 5432, "root"


def _connect() -> object:
    import psycopg2

    try:
        return psycopg2.connect(host=HOST, port=PORT, user=USER, dbname=USER, connect_timeout=3)
    except psycopg2.OperationalError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs PostgreSQL on {HOST}:{PORT}: {err}")
        pytest.skip(f"no PostgreSQL on {HOST}:{PORT}: {err}")


@pytest.fixture
def postgres_uri() -> Iterator[str]:
    """A fresh database for one test, dropped afterwards (MLflow creates its tables in it)."""
    conn = _connect()
    conn.autocommit = True  # type: ignore[attr-defined]
    name = f"recsys_test_{uuid.uuid4().hex[:10]}"
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+psycopg2://{USER}@{HOST}:{PORT}/{name}"  # the driver pinned in pyproject.toml
    finally:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"DROP DATABASE {name} WITH (FORCE)")  # MLflow's pool may still hold connections
        conn.close()  # type: ignore[attr-defined]


def test_pipeline_tracks_and_registers_in_postgresql(
    postgres_uri: str, tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    artifacts = (tmp_path / "artifacts").as_uri()
    config = load_config(
        tiny_config(
            tmp_path, tracking={"uri": postgres_uri, "artifacts": artifacts}, pipeline={"index": {"kind": "flat"}}
        )
    )
    outputs, reports = run_pipeline(config, tmp_path)
    assert reports[-1].status == "ran" and outputs.registration is not None
    assert outputs.registration.decision.promoted

    client = MlflowClient(postgres_uri)
    champion = client.get_model_version_by_alias(config.registered_model_name, CHAMPION)
    assert str(champion.version) == "1" and float(champion.tags["valid_ndcg_at_10"]) > 0
    found = get_champion(config.registered_model_name, postgres_uri)
    source = found and found.source
    assert source is not None and source.startswith(artifacts)
    assert Bundle(Path(urlparse(source).path)).version, "the registered source holds the bundle"
    experiment = client.get_experiment_by_name(config.experiment_name)
    assert experiment is not None
    names = {r.info.run_name for r in client.search_runs([experiment.experiment_id])}
    assert names == {
        "pipeline tiny-sasrec", "prepare_data", "tiny-sasrec", "build_index", "evaluate", "register tiny-sasrec"
    }  # fmt: skip
    dashboard = from_mlflow(postgres_uri)  # the dashboard reads a PostgreSQL store like a SQLite one
    assert [run.name for run in dashboard.runs] == ["tiny-sasrec"] and len(dashboard.evaluations) == 1
    assert dashboard.evaluations[0].report["slices"]["popularity_decile"][-1]["name"] == "10"
