"""The online API end to end: a real bundle from the pipeline (real MLflow registry), FastAPI's TestClient,
the in-process and the real Redis history stores."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recsys.data.prepared import load_prepared
from serving.main import create_app
from serving.settings import ServingSettings
from tests.serving.conftest import redis_or_skip


@pytest.fixture(scope="module")
def client(registry: tuple[str, str, Path]) -> Iterator[TestClient]:
    uri, name, _ = registry
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as test_client:
        yield test_client


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    ready = client.get("/readyz").json()
    assert ready["status"] == "ok" and ready["model_version"].startswith("tiny-sasrec@")


def test_known_user_gets_model_recommendations_without_seen_items(client: TestClient, registry: tuple) -> None:
    response = client.post("/v1/recommendations", json={"user_id": "u00001", "k": 10})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["source"] == "model" and body["history_length"] > 0 and len(body["items"]) == 10
    scores = [item["score"] for item in body["items"]]
    assert scores == sorted(scores, reverse=True)
    data = load_prepared(registry[2])
    seen = {data.items["item_id"][int(i) - 1] for i in data.sequences.row(data.user_row("u00001"))}
    assert not seen & {item["item_id"] for item in body["items"]}


def test_explicit_history_is_the_same_as_the_users_history(client: TestClient, registry: tuple) -> None:
    data = load_prepared(registry[2])
    history = [data.items["item_id"][int(i) - 1] for i in data.sequences.row(data.user_row("u00002"))]
    by_user = client.post("/v1/recommendations", json={"user_id": "u00002"}).json()["items"]
    by_history = client.post("/v1/recommendations", json={"history": history}).json()["items"]
    assert [i["item_id"] for i in by_user] == [i["item_id"] for i in by_history]


def test_unknown_user_falls_back_to_popularity(client: TestClient) -> None:
    body = client.post("/v1/recommendations", json={"user_id": "never-seen", "k": 5}).json()
    assert body["source"] == "popularity" and body["history_length"] == 0 and len(body["items"]) == 5


def test_events_change_the_next_recommendations(client: TestClient, registry: tuple) -> None:
    user = f"new-{uuid.uuid4().hex[:8]}"
    before = client.post("/v1/recommendations", json={"user_id": user}).json()
    data = load_prepared(registry[2])
    items = data.items["item_id"].to_list()[:3]
    posted = client.post("/v1/events", json={"user_id": user, "item_ids": [*items, "no-such-item"]}).json()
    assert posted["accepted"] == 3 and posted["unknown_items"] == ["no-such-item"]
    after = client.post("/v1/recommendations", json={"user_id": user}).json()
    assert before["source"] == "popularity" and after["source"] == "model" and after["history_length"] == 3
    assert not set(items) & {i["item_id"] for i in after["items"]}  # what they just saw is excluded


def test_similar_items(client: TestClient, registry: tuple) -> None:
    data = load_prepared(registry[2])
    item = data.items["item_id"][0]
    body = client.get(f"/v1/similar-items/{item}", params={"k": 5}).json()
    assert body["item_id"] == item and len(body["items"]) == 5 and item not in {i["item_id"] for i in body["items"]}
    assert client.get("/v1/similar-items/no-such-item").status_code == 404
    assert client.get(f"/v1/similar-items/{item}", params={"k": 101}).status_code == 422


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"user_id": "u00001", "k": 0}, "greater than or equal to 1"),
        ({"user_id": "u00001", "k": 101}, "less than or equal to 100"),
        ({"user_id": "u00001", "history": ["a"]}, "exactly one of user_id or history"),
        ({}, "exactly one of user_id or history"),
        ({"user_id": "u00001", "colour": "red"}, "Extra inputs are not permitted"),
        ({"user_id": "u00001", "domain": "sports"}, "serves a single domain"),
        ({"history": "not-a-list"}, "valid list"),
        ({"user_id": "u00001", "k": True}, "valid integer"),  # strict: JSON's true is not a number
        ({"user_id": "u00001", "k": "10"}, "valid integer"),  # nor is a string of digits
    ],
)
def test_invalid_requests_get_422_with_a_message(client: TestClient, body: dict, message: str) -> None:
    response = client.post("/v1/recommendations", json=body)
    assert response.status_code == 422 and message in response.text


def test_redis_store_and_degraded_mode(registry: tuple) -> None:
    uri, name, _ = registry
    url = "redis://127.0.0.1:6379/15"
    redis_or_skip(url)
    data = load_prepared(registry[2])
    items = data.items["item_id"].to_list()[:2]
    user = f"redis-{uuid.uuid4().hex[:8]}"
    settings = ServingSettings(
        model_name=name, tracking_uri=uri, history_store="redis", redis_url=url, events_per_user=3
    )
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json={"user_id": user, "item_ids": items}).status_code == 200
        body = client.post("/v1/recommendations", json={"user_id": user}).json()
        assert body["source"] == "model" and body["history_length"] == 2 and not body["degraded"]
        client.post("/v1/events", json={"user_id": user, "item_ids": data.items["item_id"].to_list()[2:6]})
        assert client.post("/v1/recommendations", json={"user_id": user}).json()["history_length"] == 3  # trimmed
    down = ServingSettings(model_name=name, tracking_uri=uri, history_store="redis", redis_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(down)) as client:
        body = client.post("/v1/recommendations", json={"user_id": "u00001"})
        assert body.status_code == 200 and body.json()["degraded"] and body.json()["source"] == "model"
        assert client.post("/v1/events", json={"user_id": user, "item_ids": items}).status_code == 503
        assert client.get("/readyz").json()["status"] == "degraded"


def test_metrics_count_requests_by_route_and_time_the_model(client: TestClient) -> None:
    client.post("/v1/recommendations", json={"user_id": "u00004"})
    client.post("/v1/recommendations", json={"user_id": "u00004", "k": 0})
    client.get("/v1/similar-items/no-such-item")
    text = client.get("/metrics").text
    assert 'recsys_http_requests_total{route="/v1/recommendations",status="200"}' in text
    assert 'recsys_http_requests_total{route="/v1/recommendations",status="422"}' in text
    assert 'recsys_http_requests_total{route="/v1/similar-items/{item_id}",status="404"}' in text
    count = next(line for line in text.splitlines() if line.startswith("recsys_model_call_seconds_count"))
    assert float(count.split()[-1]) >= 1


@pytest.mark.parametrize("freeze", [True, False])
def test_a_loaded_model_is_exempt_from_full_collections_whose_pauses_are_metered(
    registry: tuple[str, str, Path], freeze: bool
) -> None:
    uri, name, _ = registry
    gc.unfreeze()
    callbacks = len(gc.callbacks)
    try:
        with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri, gc_freeze=freeze))) as client:
            assert (gc.get_freeze_count() > 0) == freeze  # the loaded model's objects, when asked
            gc.collect()
            text = client.get("/metrics").text
            full = next(
                line for line in text.splitlines() if line.startswith('recsys_gc_pause_seconds_count{generation="2"}')
            )
            assert float(full.split()[-1]) >= 1
        assert len(gc.callbacks) == callbacks  # the stopped app's timer went with it
    finally:
        gc.unfreeze()
