"""`recsys serve` as a real server process on loopback, answering real HTTP requests; configured by its options or,
as documented, by the RECSYS_* environment alone."""

from __future__ import annotations

from pathlib import Path

import httpx
from typer.testing import CliRunner

from cli import app
from pipelines.registry import get_champion
from recsys.data.prepared import load_prepared
from tests.conftest import recsys_serve


def test_recsys_serve_answers_http(registry: tuple[str, str, Path]) -> None:
    uri, name, data_dir = registry
    items = load_prepared(data_dir).items["item_id"].to_list()[:3]
    with recsys_serve("--model-name", name, "--tracking-uri", uri, "--events-per-user", "2") as (base, server):
        response = httpx.post(f"{base}/v1/recommendations", json={"user_id": "u00003", "k": 3}, timeout=10)
        assert response.status_code == 200 and len(response.json()["items"]) == 3
        httpx.post(f"{base}/v1/events", json={"user_id": "new-user", "item_ids": items}, timeout=10)
        new_user = httpx.post(f"{base}/v1/recommendations", json={"user_id": "new-user"}, timeout=10).json()
        assert new_user["history_length"] == 2  # the option reached the history store: the oldest event was dropped
        assert httpx.get(f"{base}/openapi.json", timeout=5).json()["paths"].keys() >= {
            "/v1/recommendations",
            "/v1/events",
        }
    assert server.stdout is not None
    assert "serving tiny-sasrec@" in server.stdout.read()


def test_the_environment_alone_configures_recsys_serve(registry: tuple[str, str, Path]) -> None:
    uri, name, _ = registry
    env = {"RECSYS_TRACKING_URI": uri, "RECSYS_MODEL_NAME": name, "RECSYS_HISTORY_STORE": "memory"}
    with recsys_serve(env={**env, "MLFLOW_TRACKING_URI": "sqlite:////nonexistent/other.db"}) as (base, server):
        ready = httpx.get(f"{base}/readyz", timeout=5).json()
        reloaded = httpx.post(f"{base}/v1/admin/reload", timeout=10).json()
        recommended = httpx.post(f"{base}/v1/recommendations", json={"user_id": "u00003", "k": 3}, timeout=10)
    champion = get_champion(name, uri)
    assert champion is not None
    assert reloaded["registry_version"] == champion.version  # the registry of RECSYS_TRACKING_URI, not MLflow's
    assert ready["model_version"].startswith(f"{name}@") and recommended.status_code == 200
    assert server.stdout is not None and f"serving {name}@" in server.stdout.read()


def test_nothing_to_serve_exits_2_with_the_fix() -> None:
    result = CliRunner().invoke(app, ["serve"], env={"RECSYS_MODEL_NAME": "", "RECSYS_BUNDLE": ""})
    assert result.exit_code == 2 and "nothing to serve" in result.output and "RECSYS_MODEL_NAME" in result.output


def test_every_serving_setting_is_an_option_that_names_its_variable() -> None:
    from serving.settings import ServingSettings

    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "400"})
    for field in ServingSettings.model_fields:
        assert f"--{field.replace('_', '-')}" in result.output, field
        assert f"RECSYS_{field.upper()}" in result.output, field
