"""The ranking stage in serving: a two-stage bundle (retriever top-C -> MoE ranker) trained, evaluated (with its
expert load for the dashboard), registered and served; a ranker over several candidate sources served with each
source's time in /metrics."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from fastapi.testclient import TestClient

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from serving.main import create_app
from serving.recommender import Recommender
from serving.settings import ServingSettings
from tests.serving.conftest import champion_bundle


def test_a_two_stage_bundle_serves_the_rankers_order_of_the_retrievers_candidates(
    tmp_path: Path, tiny_config: Callable[..., Path], registry: tuple[str, str, Path]
) -> None:
    _, retriever_name, data_dir = registry
    retriever_dir = data_dir.parents[1] / "models" / retriever_name
    params = {"num_candidates": 10, "max_history": 20, "dim": 32, "hidden": 32, "head": "moe", "num_experts": 4,
              "top_k": 2}  # fmt: skip
    model = {"name": "ranker", "upstream": {"retriever": str(retriever_dir)}, "params": params}
    config = load_config(tiny_config(tmp_path, name="tiny-two-stage", model=model, train={"schedule": {"epochs": 1}}))
    outputs, _ = run_pipeline(config, tmp_path)
    assert outputs.evaluation is not None
    evaluation = json.loads((outputs.evaluation.evaluation_dir / "evaluation.json").read_text())
    assert [row["epoch"] for row in evaluation["expert_load"]] == [1]  # the dashboard's expert-load section
    two_stage = Recommender(champion_bundle(config)[2])
    history = [1, 2, 3]
    served = two_stage.recommend(history, k=10, exclude_seen=False)
    model = two_stage.model
    candidates = model.candidates(torch.tensor([history]), None).items[0]  # type: ignore[operator]
    item_ids = two_stage.catalogue.item_ids
    assert {r.item_id for r in served} == {item_ids[int(i) - 1] for i in candidates}  # same 10, reordered
    scores = [r.score for r in served]
    assert scores == sorted(scores, reverse=True)


def test_a_ranker_over_several_sources_is_served_and_times_each_source(
    tmp_path: Path, tiny_config: Callable[..., Path], registry: tuple[str, str, Path]
) -> None:
    _, retriever_name, data_dir = registry
    retriever_dir = data_dir.parents[1] / "models" / retriever_name
    sources = [{"kind": "retriever", "top": 10}, {"kind": "content", "top": 5, "recent": 3},
               {"kind": "new_items", "top": 3}, {"kind": "model", "index": 0, "top": 5, "label": "second"}]  # fmt: skip
    params = {"max_history": 20, "dim": 32, "hidden": 32, "use_content": True, "residual": True, "sources": sources}
    upstream = {"retriever": str(retriever_dir), "extra_retrievers": [str(retriever_dir)]}  # the same one, twice
    model = {"name": "ranker", "upstream": upstream, "params": params}
    config = load_config(tiny_config(tmp_path, name="tiny-sources", model=model, train={"schedule": {"epochs": 1}}))
    outputs, _ = run_pipeline(config, tmp_path)
    assert outputs.registration is not None
    settings = ServingSettings(bundle=outputs.registration.bundle_dir)
    with TestClient(create_app(settings)) as client:
        answer = client.post("/v1/recommendations", json={"history": ["i00001", "i00002"], "k": 10})
        assert answer.status_code == 200 and len(answer.json()["items"]) == 10
        text = client.get("/metrics").text
    for source in ("retriever", "content", "new_items", "second"):
        count = next(line for line in text.splitlines()
                     if line.startswith(f'recsys_candidate_source_seconds_count{{source="{source}"}}'))  # fmt: skip
        assert float(count.split()[-1]) == 1.0  # one model call, each source timed once
    assert "recsys_candidate_source_failures_total{" not in text  # none failed
