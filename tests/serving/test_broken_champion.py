"""A champion that cannot be loaded: the previous model keeps serving, the reload answers a clear 503, /readyz and
/metrics report it, and retrying does not flood the log."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipelines.config import load_config
from pipelines.registry import POINT, register_bundle
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import MODEL_FILE
from serving.main import create_app
from serving.settings import ServingSettings
from tests.serving.conftest import ADMIN, ADMIN_TOKEN


def test_a_broken_champion_leaves_the_served_model_and_says_so(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(tiny_config(tmp_path))
    outputs, _ = run_pipeline(config, tmp_path)
    assert outputs.model is not None
    uri, name = config.tracking.resolved_uri(), config.registered_model_name
    broken = tmp_path / "broken-model"  # a better validation score, unreadable weights
    shutil.copytree(outputs.model.model_dir, broken)
    metrics = json.loads((broken / "metrics.json").read_text())
    metrics["valid"]["ndcg@10"] += 0.01
    (broken / "metrics.json").write_text(json.dumps(metrics))
    (broken / MODEL_FILE).write_bytes(b"not a model")
    settings = ServingSettings(
        model_name=name, tracking_uri=uri, reload_interval_s=0, reload_min_interval_s=0, admin_token=ADMIN_TOKEN
    )
    with TestClient(create_app(settings)) as client:
        serving = client.get("/readyz").json()["model_version"]
        bundle = Bundle.write(tmp_path / "bundle-v2", name=name, model_dir=broken)
        assert register_bundle(bundle, name, uri, POINT).promoted  # better by its metrics.json: the point rule
        with caplog.at_level(logging.INFO, logger="serving"):
            reloads = [client.post("/v1/admin/reload", headers=ADMIN) for _ in range(20)]
        ready = client.get("/readyz").json()
        recommended = client.post("/v1/recommendations", json={"user_id": "u00001"})
        metrics_text = client.get("/metrics").text
    assert {r.status_code for r in reloads} == {503}
    assert f"champion v2 of {name} cannot be loaded" in reloads[0].json()["detail"]
    assert ready["status"] == "degraded" and ready["model_version"] == serving and "v2" in ready["reload_error"]
    assert recommended.status_code == 200 and recommended.json()["model_version"] == serving
    assert "recsys_model_reload_failures_total 20.0" in metrics_text
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "still serving v1" in errors[0].getMessage()  # one line, not one per retry
    assert not any(r.exc_info for r in errors)  # no traceback at the default level
