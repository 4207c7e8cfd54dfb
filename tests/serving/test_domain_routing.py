"""A domain-adapted bundle (MLoRA): per-domain adapters trained over a frozen multi-domain SASRec by the pipeline,
registered and served; the request's `domain` picks the adapter and the items; one adapter file hot-swaps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.errors import ConfigError
from recsys.models.domain_adapters import DomainAdaptedRetriever
from recsys.modules.lora import lora_layers, save_adapter
from serving.main import create_app
from serving.recommender import Recommender
from serving.settings import ServingSettings
from tests.serving.conftest import ADMIN, ADMIN_TOKEN, champion_bundle


@pytest.fixture(scope="module")
def adapted_bundle(
    tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path], registry: tuple[str, str, Path]
) -> tuple[str, str, Bundle]:
    """(tracking URI, registered model name, bundle) of adapters over the `registry` fixture's SASRec."""
    _, base_name, data_dir = registry
    work = tmp_path_factory.mktemp("adapters")
    model = {
        "name": "domain_adapters",
        "upstream": {"base": str(data_dir.parents[1] / "models" / base_name)},
        "params": {"domains": ["beauty", "home", "sports"], "embedding_rank": 1},  # block and item adapters
    }
    config = load_config(tiny_config(work, name="tiny-adapters", model=model, train={"schedule": {"epochs": 1}}))
    sampled_model = {**model, "training": {"loss": "sampled_softmax"}}
    sampled = tiny_config(work, name="tiny-adapters-sampled", model=sampled_model)
    with pytest.raises(ConfigError, match="item adapters"):  # would move the other domains' item rows
        run_pipeline(load_config(sampled), work)
    outputs, _ = run_pipeline(config, work)
    assert outputs.model is not None
    metrics = outputs.model.metrics
    assert metrics["test"]["ndcg@10"] > 0
    return champion_bundle(config)


def test_requests_get_their_domains_items_through_its_adapter(adapted_bundle: tuple[str, str, Bundle]) -> None:
    uri, name, bundle = adapted_bundle
    recommender = Recommender(bundle)
    model = recommender.model
    assert isinstance(model, DomainAdaptedRetriever) and recommender.domains == ["beauty", "home", "sports"]
    item_domain = model.item_domain
    item_ids = ["", *recommender.catalogue.item_ids]
    domain_of = {item_ids[i]: recommender.domains[int(item_domain[i])] for i in range(1, len(item_ids))}
    beauty = [item_ids[i] for i in torch.nonzero(item_domain == 0).squeeze(1)[:4].tolist()]
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri))) as client:
        by_history = client.post("/v1/recommendations", json={"history": beauty, "k": 10}).json()
        asked = client.post("/v1/recommendations", json={"history": beauty, "k": 10, "domain": "sports"}).json()
        new_user = client.post("/v1/recommendations", json={"user_id": "nobody", "k": 5, "domain": "home"}).json()
        unknown = client.post("/v1/recommendations", json={"history": beauty, "domain": "toys"})
    assert {domain_of[i["item_id"]] for i in by_history["items"]} == {"beauty"}  # the history's domain
    assert {domain_of[i["item_id"]] for i in asked["items"]} == {"sports"}  # the requested one
    assert new_user["source"] == "popularity" and {domain_of[i["item_id"]] for i in new_user["items"]} == {"home"}
    assert unknown.status_code == 422
    assert "unknown domain 'toys': this bundle serves beauty, home, sports" in unknown.text
    # the served order is the sports adapter's ranking of the sports items
    history = torch.tensor(recommender.item_idx(beauty)[0])
    expected = model.score_in(history[None], torch.tensor([2]))[0]
    expected[history] = float("-inf")  # exclude_seen
    top = [item_ids[i] for i in expected.topk(10).indices.tolist()]
    assert [i["item_id"] for i in asked["items"]] == top


def test_one_domains_adapter_is_hot_swapped_from_its_file(
    adapted_bundle: tuple[str, str, Bundle], registry: tuple[str, str, Path], tmp_path: Path
) -> None:
    uri, name, bundle = adapted_bundle
    retrained = Recommender(bundle).model
    assert isinstance(retrained, DomainAdaptedRetriever)
    torch.manual_seed(1)
    with torch.no_grad():  # stands in for a retrained sports adapter: its block layers and its items' rows
        for layer in lora_layers(retrained):
            layer.adapter("sports").B.normal_()
        rows = retrained.items.domain_rows("sports")
        retrained.items.A[rows] = torch.randn(len(rows), 1)
    root = tmp_path / "adapters"
    save_adapter(retrained, "sports", root / "sports" / "v2.pt")
    (root / "sports" / "junk.pt").write_text("not an adapter")
    (root / "toys").mkdir()
    (tmp_path / "outside.pt").write_bytes((root / "sports" / "v2.pt").read_bytes())
    (root / "sports" / "escape.pt").symlink_to(tmp_path / "outside.pt")  # a link out of the root
    (root / "sports" / "loop.pt").symlink_to(root / "sports" / "loop.pt")  # links that never resolve
    (root / "sports" / "ping.pt").symlink_to(root / "sports" / "pong.pt")
    (root / "sports" / "pong.pt").symlink_to(root / "sports" / "ping.pt")
    torch.save({"x": torch.zeros(2)}, root / "sports" / "wrong_keys.pt")
    sports = torch.nonzero(retrained.item_domain == 2).squeeze(1)[:3]
    settings = ServingSettings(model_name=name, tracking_uri=uri, admin_token=ADMIN_TOKEN, adapter_root=root)
    with TestClient(create_app(settings)) as client:
        item_ids = ["", *client.app.state.serving.recommender.catalogue.item_ids]  # type: ignore[attr-defined]
        body = {"history": [item_ids[i] for i in sports.tolist()], "k": 10, "exclude_seen": False}
        before = client.post("/v1/recommendations", json=body).json()
        anonymous = client.post("/v1/admin/adapters/sports", json={"version": "v2"})
        swapped = client.post("/v1/admin/adapters/sports", json={"version": "v2"}, headers=ADMIN)
        after = client.post("/v1/recommendations", json=body).json()
        again = client.post("/v1/admin/adapters/sports", json={"version": "v2"}, headers=ADMIN)
        junk = client.post("/v1/admin/adapters/sports", json={"version": "junk"}, headers=ADMIN)
        unknown = client.post("/v1/admin/adapters/toys", json={"version": "v2"}, headers=ADMIN)
        escape = client.post("/v1/admin/adapters/sports", json={"version": "escape"}, headers=ADMIN)
        missing = client.post("/v1/admin/adapters/sports", json={"version": "missing"}, headers=ADMIN)
        loops = [client.post("/v1/admin/adapters/sports", json={"version": v}, headers=ADMIN) for v in ("loop", "ping")]
        wrong_keys = client.post("/v1/admin/adapters/sports", json={"version": "wrong_keys"}, headers=ADMIN)
    assert anonymous.status_code == 401
    assert swapped.status_code == 200 and "+sports:" in swapped.json()["model_version"]
    assert after["model_version"] == swapped.json()["model_version"] != before["model_version"]
    assert again.json()["model_version"] == swapped.json()["model_version"]  # the same file again: the same version
    expected = retrained.score(sports[None])[0].topk(10).indices.tolist()
    assert [i["item_id"] for i in after["items"]] == [item_ids[i] for i in expected]
    assert junk.status_code == 422 and "junk.pt: not an adapter file of this model" in junk.text
    assert str(root) not in junk.text  # the server's directories stay its own
    assert unknown.status_code == 422 and "unknown domain 'toys'" in unknown.text
    # outside the root is as absent as missing: an answer never tells whether some other file exists
    assert escape.status_code == missing.status_code == 404
    assert escape.json()["detail"].replace("escape", "V") == missing.json()["detail"].replace("missing", "V")
    for loop in loops:
        assert loop.status_code == 404, loop.text
    assert wrong_keys.status_code == 422 and "wrong_keys.pt: not an adapter file" in wrong_keys.text
    assert str(tmp_path) not in wrong_keys.text and str(tmp_path.resolve()) not in wrong_keys.text
    single_uri, single_name, _ = registry
    single = ServingSettings(
        model_name=single_name, tracking_uri=single_uri, admin_token=ADMIN_TOKEN, adapter_root=root
    )
    with TestClient(create_app(single)) as client:
        refused = client.post("/v1/admin/adapters/sports", json={"version": "v2"}, headers=ADMIN)
    assert refused.status_code == 409 and "no domain adapters" in refused.text
