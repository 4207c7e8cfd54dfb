"""A query-aware model served: `POST /v1/search` (a text query alone), `POST /v1/recommendations` with a `query`
beside the history, the signals each response names, the 422s of empty and oversized queries and the 409 of a model
that reads none."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.semantic_ids.content import ContentConfig, embed_texts
from serving.main import create_app
from serving.recommender import Recommender
from serving.schemas import MAX_QUERY_CHARS
from serving.settings import ServingSettings
from tests.serving.conftest import champion_bundle

PARAMS = {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64}


@pytest.fixture(scope="module")
def query_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[str, str, Bundle]:
    """(tracking URI, registered model name, bundle) of a tiny query-aware model."""
    work = tmp_path_factory.mktemp("search")
    config = load_config(tiny_config(
        work, name="tiny-query-aware", model={"name": "query_aware", "params": PARAMS},
        train={"schedule": {"epochs": 1}}, pipeline={"index": {"kind": "flat"}},
    ))  # fmt: skip
    run_pipeline(config, work)
    return champion_bundle(config)


def test_search_ranks_the_catalogue_for_the_query_alone(query_bundle: tuple[str, str, Bundle]) -> None:
    uri, name, bundle = query_bundle
    recommender = Recommender(bundle)
    query = recommender.catalogue.title(4)
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        found = client.post("/v1/search", json={"query": f"  {query} ", "k": 5})
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["signals"] == ["query"] and len(body["items"]) == 5
    # the model's own ranking of the query with no history, in the same order and scores
    model = recommender.model
    vector = torch.from_numpy(embed_texts([query], ContentConfig(model=model.config.encoder, progress=False)))
    with torch.no_grad():
        scores = model.score_with_queries(torch.zeros(1, 0, dtype=torch.long), vector, [query])[0]
    scores[0] = -torch.inf
    expected = scores.topk(5)
    item_ids = ["", *recommender.catalogue.item_ids]
    assert [i["item_id"] for i in body["items"]] == [item_ids[i] for i in expected.indices.tolist()]
    assert [i["score"] for i in body["items"]] == pytest.approx(expected.values.tolist(), abs=1e-4)


def test_a_query_beside_the_history_moves_the_recommendations(query_bundle: tuple[str, str, Bundle]) -> None:
    uri, name, bundle = query_bundle
    recommender = Recommender(bundle)
    user = recommender.histories.user_ids[0]
    history = recommender.training_history(user)
    assert history is not None
    title = recommender.catalogue.title(1)
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        plain = client.post("/v1/recommendations", json={"user_id": user, "k": 10}).json()
        queried = client.post("/v1/recommendations", json={"user_id": user, "k": 10, "query": title}).json()
        new_user = client.post("/v1/recommendations", json={"history": [], "k": 3, "query": title}).json()
        cold = client.post("/v1/recommendations", json={"history": [], "k": 3}).json()
    assert plain["signals"] == ["history"] and queried["signals"] == ["history", "query"]
    assert [i["score"] for i in plain["items"]] != pytest.approx([i["score"] for i in queried["items"]], abs=1e-6)
    seen = {recommender.catalogue.item_ids[i - 1] for i in history[0]}
    assert not seen & {i["item_id"] for i in queried["items"]}  # exclude_seen holds with a query too
    assert new_user["signals"] == ["query"] and new_user["source"] == "model"
    assert cold["signals"] == ["popularity"] and cold["source"] == "popularity"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": "   "}, "at least 1 character"),
        ({"query": "x" * (MAX_QUERY_CHARS + 1)}, f"at most {MAX_QUERY_CHARS} characters"),
        ({"query": "lipstick", "k": 0}, "greater than or equal to 1"),
        ({"query": "lipstick", "extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_queries_are_422_with_the_limit(
    query_bundle: tuple[str, str, Bundle], body: dict[str, object], message: str
) -> None:
    uri, name, _ = query_bundle
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        response = client.post("/v1/search", json=body)
    assert response.status_code == 422 and message in response.text, response.text


def test_a_model_without_queries_says_so(registry: tuple[str, str, Path]) -> None:
    uri, name, _ = registry  # the tiny SASRec champion
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        search = client.post("/v1/search", json={"query": "lipstick"})
        recommend = client.post("/v1/recommendations", json={"history": [], "query": "lipstick"})
    for response in (search, recommend):
        assert response.status_code == 409 and "takes no text query" in response.text, response.text
        assert "serve a model that reads queries" in response.text
