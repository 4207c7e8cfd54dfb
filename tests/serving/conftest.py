"""The champion bundle of the registry fixture (tests/conftest.py), loaded for the serving tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.config import ExperimentConfig, load_config
from pipelines.runner import run_pipeline
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
def content_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> Bundle:
    """A content-first SASRec on a cold-start split of the tiny data, registered and indexed by its pipeline."""
    work = tmp_path_factory.mktemp("content-first")
    params = {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64, "content_first": True}
    config = load_config(
        tiny_config(
            work, name="tiny-content-first", model={"name": "sasrec", "params": params},
            data={"cold_start_fraction": 0.2, "seed": 1}, train={"schedule": {"epochs": 2}},
            pipeline={"index": {"kind": "flat"}},
        )
    )  # fmt: skip
    run_pipeline(config, work)
    return champion_bundle(config)[2]


@pytest.fixture(scope="session")
def recommender(registry: tuple[str, str, Path]) -> Recommender:
    """The champion bundle of `registry`, loaded."""
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None
    return Recommender(bundle)
