"""The online history stores: the in-process one stays bounded, the Redis one expires users and says once (not per
request) when it goes down and when it is back, in the log and in /metrics."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from serving.history import Event, HistoryUnavailableError, InMemoryHistoryStore, RedisHistoryStore
from serving.main import create_app
from serving.settings import ServingSettings
from tests.serving.conftest import redis_or_skip

REDIS_URL = "redis://127.0.0.1:6379/15"
DOWN_URL = "redis://127.0.0.1:1/0"  # nothing listens there


def test_the_in_process_store_drops_the_least_recently_active_user() -> None:
    store = InMemoryHistoryStore(events_per_user=2, max_users=3)
    for user in ("a", "b", "c"):
        store.append(user, [Event("i1", 1)])
    store.append("a", [Event("i2", 2), Event("i3", 3)])  # a is the most recent now
    store.append("d", [Event("i1", 4)])  # one user too many: b, the least recently active, goes
    assert len(store) == 3 and store.recent("b") == []
    assert store.recent("a") == [Event("i2", 2), Event("i3", 3)]  # and each user keeps the most recent events


def test_redis_keys_expire_after_the_users_last_event() -> None:
    redis_or_skip(REDIS_URL)
    store = RedisHistoryStore(REDIS_URL, events_per_user=5, ttl_s=120)
    user = f"ttl-{uuid.uuid4().hex[:8]}"
    store.append(user, [Event("i1", 1)])
    assert 0 < redis.Redis.from_url(REDIS_URL).ttl(f"recsys:history:{user}") <= 120


def test_a_redis_outage_is_logged_once_and_its_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    redis_or_skip(REDIS_URL)
    store = RedisHistoryStore(REDIS_URL, events_per_user=5, ttl_s=60)
    healthy = store._redis
    store._redis = redis.Redis.from_url(DOWN_URL, socket_connect_timeout=0.2)  # the server goes away
    with caplog.at_level(logging.INFO, logger="serving.history"):
        for _ in range(20):
            with pytest.raises(HistoryUnavailableError):
                store.recent("u1")
        assert not store.available
        store._redis = healthy  # and comes back
        for _ in range(5):
            store.recent("u1")
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is down" in m for m in messages) == 1 and sum("is back" in m for m in messages) == 1
    assert store.available and "127.0.0.1:1/0" in messages[0] and "redis://" not in messages[0]


def test_redis_down_at_start_up_is_said_once_and_exported(
    registry: tuple[str, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    uri, name, _ = registry
    settings = ServingSettings(model_name=name, tracking_uri=uri, history_store="redis", redis_url=DOWN_URL)
    with caplog.at_level(logging.INFO, logger="serving"), TestClient(create_app(settings)) as client:
        warned_at_start = any("is down" in r.getMessage() for r in caplog.records)
        for _ in range(10):
            assert client.post("/v1/recommendations", json={"user_id": "u00001"}).json()["degraded"]
        metrics = client.get("/metrics").text
    assert warned_at_start
    assert sum("is down" in r.getMessage() for r in caplog.records) == 1  # not one line per request
    assert "recsys_history_store_up 0.0" in metrics
