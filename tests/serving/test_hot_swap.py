"""Hot swap: a newly promoted champion is served without failing the requests in flight."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from pipelines.config import load_config
from pipelines.registry import POINT, register_bundle
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from serving.main import create_app
from serving.settings import ServingSettings
from tests.serving.conftest import ADMIN, ADMIN_TOKEN


def test_new_champion_is_swapped_in_under_load(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = load_config(tiny_config(tmp_path, pipeline={"index": {"kind": "flat"}}))
    outputs, _ = run_pipeline(config, tmp_path)
    assert outputs.model is not None
    uri, name = config.tracking.resolved_uri(), config.registered_model_name
    settings = ServingSettings(
        model_name=name, tracking_uri=uri, reload_interval_s=0, reload_min_interval_s=0, admin_token=ADMIN_TOKEN
    )

    with TestClient(create_app(settings)) as client:
        app = client.app
        old = app.state.serving.recommender  # type: ignore[attr-defined]
        assert client.post("/v1/admin/reload", headers=ADMIN).json() == {
            "reloaded": False, "model_version": old.version, "registry_version": "1",
        }  # fmt: skip
        statuses: list[int] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                statuses.append(client.post("/v1/recommendations", json={"user_id": "u00005"}).status_code)

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        # a better model is registered and promoted (v2) while requests are running
        better = tmp_path / "better-model"
        shutil.copytree(outputs.model.model_dir, better)
        metrics = json.loads((better / "metrics.json").read_text())
        metrics["valid"]["ndcg@10"] += 0.01
        (better / "metrics.json").write_text(json.dumps(metrics))
        bundle = Bundle.write(tmp_path / "bundle-v2", name=name, model_dir=better)
        assert register_bundle(bundle, name, uri, POINT).promoted  # better by its metrics.json: the point rule
        swap = client.post("/v1/admin/reload", headers=ADMIN).json()
        requests_before_stop = len(statuses)
        stop.set()
        for worker in workers:
            worker.join()

    assert swap["reloaded"] is True and swap["registry_version"] == "2"
    assert app.state.serving.recommender is not old  # type: ignore[attr-defined]
    assert requests_before_stop > 0, "requests ran while the new champion was registered and swapped in"
    assert set(statuses) == {200}, "no request failed during the swap"
