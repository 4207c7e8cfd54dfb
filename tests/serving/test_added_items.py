"""Items added at run time (`POST /v1/admin/items`) to a content-first bundle trained by the pipeline (real MLflow
registry, real FAISS index): placed by their text as a never-trained item of the catalogue is, ranked and found by the
next request, kept across a restart until a bundle includes them, refused with the reason otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from recsys.artifacts.added_items import AddedItemStore, NewItem
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import trained_data
from recsys.errors import DataError
from recsys.semantic_ids import content as content_module
from serving.loading import with_kept_items
from serving.main import create_app
from serving.recommender import InTrainedCatalogue, RecommendationQuery, Recommender
from serving.settings import ServingSettings
from tests.serving.conftest import ADMIN, ADMIN_TOKEN


def _cold_twins(bundle: Bundle, count: int) -> list[tuple[int, NewItem]]:
    """(item_idx, a new item with its title) of `count` cold items of the catalogue: never trained, so their vectors
    come from their text alone, as a new item's with the same text must."""
    data = trained_data(bundle.model_dir)
    cold = torch.nonzero(data.cold_mask).squeeze(1)[:count].tolist()
    titles = data.titles(torch.tensor(cold))
    return [(i, NewItem(f"new-{i}", title)) for i, title in zip(cold, titles, strict=True)]


def _settings(bundle: Bundle, tmp_path: Path, **fields: object) -> ServingSettings:
    return ServingSettings(
        bundle=bundle.path, admin_token=ADMIN_TOKEN, added_items_file=tmp_path / "added.json", **fields
    )  # type: ignore[arg-type]


def test_a_new_item_is_placed_and_ranked_as_a_never_trained_item_with_its_text(content_bundle: Bundle) -> None:
    recommender = Recommender(content_bundle)
    twins = _cold_twins(content_bundle, 3)
    served = recommender.with_items([item for _, item in twins])
    assert served.num_items == recommender.num_items + 3 and recommender.added_items == ()  # the original untouched
    history = recommender.histories.items[: recommender.histories.offsets[1]].tolist()
    (ranked,) = served.recommend_batch([RecommendationQuery(history, served.num_items, exclude_seen=False)])
    score = {r.item_id: r.score for r in ranked}
    catalogue_ids = recommender.catalogue.item_ids
    for item_idx, item in twins:
        assert score[item.item_id] == pytest.approx(score[catalogue_ids[item_idx - 1]], abs=1e-4)
    (reading,) = served.recommend_batch([RecommendationQuery([served.item_idx(["new-" + str(twins[0][0])])[0][0]],
                                                             10, exclude_seen=True)])  # fmt: skip
    assert twins[0][1].item_id not in [r.item_id for r in reading], "a history may hold an added item"
    again = served.with_items([NewItem(twins[0][1].item_id, "a different text altogether")])
    assert [i.item_id for i in again.added_items] == [i.item_id for _, i in twins], "a re-add replaces in place"
    assert again.added_items[0].title == "a different text altogether"
    with pytest.raises(InTrainedCatalogue, match="in the trained catalogue already"):
        served.with_items([NewItem(catalogue_ids[0], "x")])


def test_items_added_through_the_api_are_served_kept_and_counted(content_bundle: Bundle, tmp_path: Path) -> None:
    twins = _cold_twins(content_bundle, 2)
    body = {"items": [{"item_id": item.item_id, "title": item.title, "fields": {"llm_category": "Beauty > Nails"}}
                      for _, item in twins]}  # fmt: skip
    settings = _settings(content_bundle, tmp_path)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/admin/items", json=body).status_code == 401, "an admin route"
        added = client.post("/v1/admin/items", json=body, headers=ADMIN)
        assert added.status_code == 200, added.text
        assert added.json()["added"] == 2 and added.json()["live"] == 2
        assert added.json()["model_version"].endswith("+items:2")
        new_id = twins[0][1].item_id
        similar = client.get(f"/v1/similar-items/{new_id}", params={"k": 5})
        assert similar.status_code == 200 and len(similar.json()["items"]) == 5
        reply = client.post("/v1/recommendations", json={"history": [new_id], "k": 100}).json()
        assert reply["items"] and new_id not in [r["item_id"] for r in reply["items"]], "read, and excluded as seen"
        assert "recsys_added_items_live 2.0" in client.get("/metrics").text
        assert "recsys_items_added_total 2.0" in client.get("/metrics").text
    kept = json.loads((tmp_path / "added.json").read_text())
    assert [item["item_id"] for item in kept["items"]] == [item.item_id for _, item in twins]
    assert kept["items"][0]["fields"] == {"llm_category": "Beauty > Nails"}
    with TestClient(create_app(settings)) as client:  # a restart serves them again
        assert client.get(f"/v1/similar-items/{new_id}", params={"k": 5}).status_code == 200
        assert "recsys_added_items_live 2.0" in client.get("/metrics").text


def test_a_bundle_that_holds_a_kept_item_serves_it_from_its_catalogue_and_the_file_keeps_it(
    content_bundle: Bundle, tmp_path: Path
) -> None:
    recommender = Recommender(content_bundle)
    in_catalogue = recommender.catalogue.item_ids[0]
    store = AddedItemStore(tmp_path / "added.json")
    kept = [NewItem(in_catalogue, "trained on now"), NewItem("brand-new", "a new lipstick")]
    store.save(kept)
    served = with_kept_items(recommender, store.load(), store, max_items=10)
    assert [item.item_id for item in served.added_items] == ["brand-new"]
    assert store.load() == kept, "kept for a bundle that lacks it (a rollback)"
    (tmp_path / "added.json").write_text("{not json")
    with pytest.raises(DataError, match=r"not a file of run-time items.*Fix: restore it"):
        store.load()


def test_a_server_taking_run_time_items_loads_their_encoder_once_before_the_first_add(
    content_bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the change thread once the bundle serves: neither the time to ready nor the first add's neighbours wait."""
    loads: list[object] = []
    real = content_module.load_encoder
    monkeypatch.setattr(content_module, "load_encoder", lambda *args, **kw: loads.append(args) or real(*args, **kw))
    with TestClient(create_app(_settings(content_bundle, tmp_path))) as client:
        client.app.state.serving.changes.run(lambda: None)  # type: ignore[attr-defined]  # what was queued before ran
        assert len(loads) == 1
        for item_id in ("brand-new", "newer"):
            body = {"items": [{"item_id": item_id, "title": f"a new {item_id} lipstick"}]}
            assert client.post("/v1/admin/items", json=body, headers=ADMIN).status_code == 200
    assert len(loads) == 1


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"item_id": "a", "title": " "}], "should match pattern"),
        ([{"item_id": "a", "title": "x", "fields": {"Bad Name": "y"}}], "should match pattern"),
        ([{"item_id": "a", "title": "x" * 2001}], "at most 2000 characters"),
        ([], "at least 1 item"),
    ],
)
def test_bad_items_get_422_with_the_reason(content_bundle: Bundle, tmp_path: Path, items: list, message: str) -> None:
    with TestClient(create_app(_settings(content_bundle, tmp_path))) as client:
        answer = client.post("/v1/admin/items", json={"items": items}, headers=ADMIN)
        assert answer.status_code == 422 and message in answer.text, answer.text


def test_adds_are_refused_with_the_reason_when_they_cannot_be_served(
    content_bundle: Bundle, registry: tuple[str, str, Path], tmp_path: Path
) -> None:
    catalogue_id = Recommender(content_bundle).catalogue.item_ids[0]
    one = {"items": [{"item_id": "new-1", "title": "a new lipstick"}]}
    with TestClient(create_app(_settings(content_bundle, tmp_path, max_added_items=1))) as client:
        trained = client.post("/v1/admin/items", json={"items": [{"item_id": catalogue_id, "title": "x"}]},
                              headers=ADMIN)  # fmt: skip
        assert trained.status_code == 422 and "is in the trained catalogue" in trained.text
        assert client.post("/v1/admin/items", json=one, headers=ADMIN).status_code == 200
        full = client.post("/v1/admin/items", json={"items": [{"item_id": "new-2", "title": "y"}]}, headers=ADMIN)
        assert full.status_code == 409 and "RECSYS_MAX_ADDED_ITEMS" in full.text
    off = ServingSettings(bundle=content_bundle.path, admin_token=ADMIN_TOKEN)
    with TestClient(create_app(off)) as client:
        answer = client.post("/v1/admin/items", json=one, headers=ADMIN)
        assert answer.status_code == 409 and "RECSYS_ADDED_ITEMS_FILE" in answer.text
    uri, name, _ = registry  # an ID-only SASRec cannot place an item it never trained on
    id_only = ServingSettings(model_name=name, tracking_uri=uri, admin_token=ADMIN_TOKEN,
                              added_items_file=tmp_path / "other.json")  # fmt: skip
    with TestClient(create_app(id_only)) as client:
        answer = client.post("/v1/admin/items", json=one, headers=ADMIN)
        assert answer.status_code == 409 and "content_first" in answer.text
