"""Who may call what: the admin routes exist only with a token and answer only to it, API keys guard the public
routes when configured, reloads are rate-limited, and adapters are read from the adapter root alone."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.responses import PlainTextResponse

from serving import security
from serving.main import create_app
from serving.security import ApiKeyGate
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
        adapter_root=secrets / "adapters", reload_min_interval_s=60, refusal_delay_s=0,  # the delay: its own test
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
    for path in ("/openapi.json", "/docs", "/dashboard", "/v1/similar-items/i00001"):  # anonymous: refused first
        assert secured.get(path).status_code == 401, path
    assert secured.post("/v1/recommendations", content=b"{not json").status_code == 401  # before the body's 400
    assert secured.get("/metrics").status_code == 200  # the scraper's
    schemes = secured.get("/openapi.json", headers={"X-API-Key": "key-one"}).json()["components"]["securitySchemes"]
    assert {"type": "apiKey", "in": "header", "name": "X-API-Key"}.items() <= next(
        s for s in schemes.values() if s["type"] == "apiKey"
    ).items()


def test_a_refusal_waits_without_holding_up_keyed_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    delay = 0.4
    gate = ApiKeyGate(PlainTextResponse("ok"), frozenset({"key-one"}), refusal_delay_s=delay)

    async def timed(client: httpx.AsyncClient, headers: dict[str, str]) -> tuple[int, float]:
        start = time.perf_counter()
        response = await client.get("/v1/anything", headers=headers)
        return response.status_code, time.perf_counter() - start

    async def at_once(*headers: dict[str, str]) -> list[tuple[int, float]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(gate), base_url="http://test") as client:
            return list(await asyncio.gather(*(timed(client, h) for h in headers)))

    anonymous, wrong, keyed = asyncio.run(at_once({}, {"X-API-Key": "guess"}, {"X-API-Key": "key-one"}))
    assert anonymous[0] == 401 and wrong[0] == 403 and keyed[0] == 200
    assert anonymous[1] >= delay and wrong[1] >= delay
    assert keyed[1] < delay  # the event loop was free while the refusals slept
    monkeypatch.setattr(security, "MAX_DELAYED_REFUSALS", 1)  # past the cap, refusals go out at once
    first, second = sorted(asyncio.run(at_once({}, {})), key=lambda answer: answer[1])
    assert first[0] == second[0] == 401 and first[1] < delay <= second[1]


@pytest.mark.parametrize(
    "version",
    ["../../../etc/passwd", "/etc/passwd", "..", ".hidden", "a/b", "x" * 65, ""],
)
def test_an_adapter_is_named_never_located(secured: TestClient, version: str) -> None:
    response = secured.post("/v1/admin/adapters/sports", json={"version": version}, headers=ADMIN)
    assert response.status_code == 422 and "version" in response.text


def test_an_api_keys_file_without_a_key_is_refused_not_read_as_no_auth(tmp_path: Path) -> None:
    from pydantic import ValidationError

    keys = tmp_path / "keys"
    for text in ("\n  \n", "# every key revoked\n\n  # and this one\n"):  # a comment is no key
        keys.write_text(text)
        with pytest.raises(ValidationError, match=r"api_keys_file: .* holds no key .* Fix: write the keys"):
            ServingSettings(bundle=tmp_path, api_keys_file=keys)
    keys.write_text("# the shop's key\nkey-one\nevery key revoked\n")  # a comment without its '#'
    with pytest.raises(ValidationError, match=r"api_keys_file: line 3 of .* holds a space.*Fix: one secret per line"):
        ServingSettings(bundle=tmp_path, api_keys_file=keys)
    keys.write_text("# the shop's key\nkey-one\n")
    assert ServingSettings(bundle=tmp_path, api_keys_file=keys).api_keys() == {"key-one"}
