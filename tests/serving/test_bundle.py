"""A served bundle is self-contained: weights, id maps, item metadata and the users' histories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from recsys.artifacts.bundle import Bundle
from recsys.artifacts.registry import download_champion_bundle
from serving.recommender import Recommender


def test_a_bundle_needs_nothing_outside_itself(recommender: Recommender, registry: tuple, tmp_path: Path) -> None:
    """Served on another machine: the directory the model was trained on does not exist there."""
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None
    moved = Bundle(shutil.copytree(bundle.path, tmp_path / "bundle"))
    data_json = moved.model_dir / "data.json"
    data_json.write_text(json.dumps({**json.loads(data_json.read_text()), "data_dir": "/nonexistent/prepared"}))
    elsewhere = Recommender(moved)
    user = recommender.histories.user_ids[0]
    assert elsewhere.training_history(user) == recommender.training_history(user)
    assert [r.item_id for r in elsewhere.recommend([1, 2], 5, True)] == [
        r.item_id for r in recommender.recommend([1, 2], 5, True)
    ]


def test_above_the_catalogue_threshold_recommendations_come_from_the_index(
    recommender: Recommender, registry: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None and bundle.index_dir is not None
    monkeypatch.setattr("serving.recommender.ANN_ABOVE_ITEMS", 0)  # every catalogue counts as large
    by_index = Recommender(bundle)
    history = recommender.training_history(recommender.histories.user_ids[0])
    assert history is not None
    items = history[0]
    exact = [r.item_id for r in recommender.recommend(items, 10, True)]
    approximate = by_index.recommend(items, 10, True)
    assert len(approximate) == 10
    seen = {recommender.catalogue.item_ids[i - 1] for i in items}
    assert not seen & {r.item_id for r in approximate}  # the history's items are still left out
    assert len(set(exact) & {r.item_id for r in approximate}) >= 8  # the index finds (nearly) the same items
