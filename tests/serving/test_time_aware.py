"""A time-aware model served: HSTU with time buckets reads the times of the bundle's history, of the online events
(stored with their time) and of an explicit history, and the request's time (now)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import trained_data
from serving.history import Event, decode_event, encode_event
from serving.main import create_app
from serving.recommender import Recommender
from serving.settings import ServingSettings
from tests.serving.conftest import champion_bundle


@pytest.fixture(scope="module")
def timed_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[str, str, Bundle]:
    """(tracking URI, registered model name, bundle) of a tiny HSTU with time buckets."""
    work = tmp_path_factory.mktemp("timed")
    params = {"max_history": 20, "dim": 32, "num_heads": 2, "num_time_buckets": 24}
    config = load_config(
        tiny_config(
            work, name="tiny-hstu-time", model={"name": "hstu", "params": params}, train={"schedule": {"epochs": 1}}
        )
    )
    run_pipeline(config, work)
    return champion_bundle(config)


def test_served_scores_use_the_history_times(timed_bundle: tuple[str, str, Bundle]) -> None:
    uri, name, bundle = timed_bundle
    recommender = Recommender(bundle)
    user = recommender.histories.user_ids[0]
    history = recommender.training_history(user)
    assert history is not None
    items, times = history
    assert times == trained_data(bundle.model_dir).timestamps.row(0).tolist() and times[-1] > 1_600_000_000  # unix s
    item_ids = ["", *recommender.catalogue.item_ids]
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        by_user = client.post("/v1/recommendations", json={"user_id": user, "k": 5}).json()
        explicit = client.post(
            "/v1/recommendations",
            json={"history": [item_ids[i] for i in items], "timestamps": times, "k": 5},
        ).json()
        untimed = client.post("/v1/recommendations", json={"history": [item_ids[i] for i in items], "k": 5}).json()
    # the request's gap to the history is years here: the last bucket, whatever second `now` is
    expected = recommender.recommend(items, 5, exclude_seen=True, timestamps=times, request_time=int(time.time()))
    assert [i["item_id"] for i in by_user["items"]] == [r.item_id for r in expected]
    assert [i["score"] for i in by_user["items"]] == pytest.approx([r.score for r in expected], abs=1e-5)
    assert explicit["items"] == by_user["items"]
    # without times the history reads as one moment: other gaps, other scores
    assert [i["score"] for i in untimed["items"]] != pytest.approx([r.score for r in expected], abs=1e-5)
    # back right after the last event instead of years later: other scores
    soon = recommender.recommend(items, 5, exclude_seen=True, timestamps=times, request_time=times[-1] + 60)
    assert [r.score for r in soon] != pytest.approx([r.score for r in expected], abs=1e-5)


def test_online_events_keep_their_time(timed_bundle: tuple[str, str, Bundle]) -> None:
    uri, name, bundle = timed_bundle
    items = Recommender(bundle).catalogue.item_ids[:3]
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        stored = client.post("/v1/events", json={"user_id": "new", "item_ids": items, "timestamps": [10, 20, 9_000]})
        assert stored.status_code == 200
        online = client.post("/v1/recommendations", json={"user_id": "new", "k": 5}).json()
        explicit = client.post(
            "/v1/recommendations", json={"history": items, "timestamps": [10, 20, 9_000], "k": 5}
        ).json()
        mismatch = client.post("/v1/events", json={"user_id": "new", "item_ids": items, "timestamps": [1]})
    assert online["history_length"] == 3 and online["items"] == explicit["items"]
    assert mismatch.status_code == 422 and "timestamps has 1 values for 3 item_ids" in mismatch.text


def test_stored_events_round_trip_and_old_entries_read_as_unknown_time() -> None:
    assert decode_event(encode_event(Event("i:42", 1_700_000_000))) == Event("i:42", 1_700_000_000)
    assert decode_event("i00042") == Event("i00042", 0)  # a bare item id, as stored before events kept times
