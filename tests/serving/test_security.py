"""Who may call what: the admin routes exist only with a token and answer only to it, API keys guard the public
routes when configured, reloads are rate-limited, and adapters are read from the adapter root alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from serving.main import create_app
from serving.settings import ServingSettings
from tests.serving.conftest import ADMIN, ADMIN_TOKEN


@pytest.fixture(scope="module")
def secured(registry: tuple[str, str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The API with an admin token, two API keys and an adapter root."""
    uri, name, _ = registry
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "keys").write_text("key-one\n\nkey-two\n")
    (secrets / "adapters").mkdir()
    settings = ServingSettings(
        model_name=name, tracking_uri=uri, admin_token=ADMIN_TOKEN, api_keys_file=secrets / "keys",
        adapter_root=secrets / "adapters", reload_min_interval_s=60,
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        yield client


def test_without_a_token_the_admin_routes_do_not_exist(
    registry: tuple[str, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    uri, name, _ = registry
    with (
        caplog.at_level(logging.INFO, logger="serving"),
        TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client,
    ):
        reload = client.post("/v1/admin/reload")
        adapter = client.post("/v1/admin/adapters/sports", json={"version": "v1"})
        paths = client.get("/openapi.json").json()["paths"]
    assert reload.status_code == adapter.status_code == 404
    assert not any(path.startswith("/v1/admin") for path in paths)
    assert "admin routes off" in caplog.text and "RECSYS_ADMIN_TOKEN" in caplog.text


def test_admin_routes_answer_only_to_the_token(secured: TestClient) -> None:
    anonymous = secured.post("/v1/admin/reload")
    wrong = secured.post("/v1/admin/reload", headers={"Authorization": "Bearer " + "x" * 32})
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in anonymous.json()["detail"]
    assert wrong.status_code == 403 and "wrong admin token" in wrong.json()["detail"]
    first = secured.post("/v1/admin/reload", headers=ADMIN)
    again = secured.post("/v1/admin/reload", headers=ADMIN)
    assert first.status_code == 200 and first.json()["registry_version"] == "1"
    assert again.status_code == 429 and 0 < int(again.headers["retry-after"]) <= 60
    assert "retry in" in again.json()["detail"]


def test_api_keys_guard_the_public_routes_not_the_probes(secured: TestClient) -> None:
    body = {"user_id": "u00001", "k": 3}
    assert secured.post("/v1/recommendations", json=body).status_code == 401
    assert secured.post("/v1/recommendations", json=body, headers={"X-API-Key": "key-three"}).status_code == 403
    assert secured.post("/v1/recommendations", json=body, headers={"X-API-Key": "key-two"}).status_code == 200
    assert secured.get("/v1/similar-items/i00001", headers={"X-API-Key": "key-one"}).status_code in (200, 404)
    assert secured.get("/v1/similar-items/i00001").status_code == 401
    assert secured.get("/healthz").status_code == 200 and secured.get("/readyz").status_code == 200
    schemes = secured.get("/openapi.json").json()["components"]["securitySchemes"]
    assert {"type": "apiKey", "in": "header", "name": "X-API-Key"}.items() <= next(
        s for s in schemes.values() if s["type"] == "apiKey"
    ).items()


@pytest.mark.parametrize(
    "version",
    ["../../../etc/passwd", "/etc/passwd", "..", ".hidden", "a/b", "x" * 65, ""],
)
def test_an_adapter_is_named_never_located(secured: TestClient, version: str) -> None:
    response = secured.post("/v1/admin/adapters/sports", json={"version": version}, headers=ADMIN)
    assert response.status_code == 422 and "version" in response.text
