"""The champion bundle of the registry fixture (tests/conftest.py), loaded for the serving tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.config import ExperimentConfig
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.registry import download_champion_bundle
from serving.recommender import Recommender

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # the headers of an admin call


def redis_or_skip(url: str) -> None:
    """Skip without a Redis at `url`, except under CI=true (CI machines run one: its absence is a failure)."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs Redis at {url} (CI machines run one): {err}")
        pytest.skip(f"no Redis at {url}: {err}")


def champion_bundle(config: ExperimentConfig) -> tuple[str, str, Bundle]:
    """(tracking URI, registered model name, champion bundle) of a config whose pipeline has run."""
    uri = config.tracking.resolved_uri()
    bundle = download_champion_bundle(config.registered_model_name, uri)
    assert bundle is not None, f"{config.registered_model_name} has no champion in {uri}"
    return uri, config.registered_model_name, bundle


@pytest.fixture(scope="session")
def recommender(registry: tuple[str, str, Path]) -> Recommender:
    """The champion bundle of `registry`, loaded."""
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None
    return Recommender(bundle)
