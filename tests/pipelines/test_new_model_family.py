"""A model family defined in this file alone goes through the whole platform: `recsys pipeline run` prepares the data,
embeds the items' text (because the family says it reads content), trains it with the next-item recipe, indexes its
item vectors, evaluates and registers it; then the online API, started on a real port, serves it. Nothing outside
this file names it: the registry, the runner, the trainer, evaluation and serving ask its spec and its protocols."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
import yaml
from pydantic import PositiveInt
from torch import nn
from typer.testing import CliRunner

from cli import app
from pipelines.config import load_config
from pipelines.recovery import STATE_FILE
from recsys.data.times import HistoryTimes
from recsys.models.family import Input, Model, ModelFamily, ModelInputs, content_of
from recsys.models.registry import register_family
from serving.main import create_app
from serving.settings import ServingSettings
from tests.conftest import TINY_SYNTHETIC


@dataclass(frozen=True)
class ContentPoolConfig:
    num_items: int  # V
    content_dim: int = 0  # C, filled in from the content embeddings
    dim: PositiveInt = 16
    max_history: PositiveInt = 10


class ContentPool(Model[ContentPoolConfig]):
    """Item vectors from the items' text: a projection of the content embedding plus an ID residual (zero at the
    start); a user is the mean of its history's item vectors, scored against every item by a dot product.

    Dimension letters: B rows, L history, D dim, C content dim, V+1 items (0 = padding).
    """

    content: torch.Tensor  # (V+1, C) buffer: saved with the model, which serving loads alone

    def __init__(self, config: ContentPoolConfig, content: torch.Tensor | None = None) -> None:
        super().__init__(config)
        rows = config.num_items + 1
        self.register_buffer("content", torch.zeros(rows, config.content_dim) if content is None else content.clone())
        self.project = nn.Linear(config.content_dim, config.dim, bias=False)
        self.residual = nn.Embedding(rows, config.dim, padding_idx=0)
        nn.init.zeros_(self.residual.weight)

    @property
    def max_history(self) -> int:
        return self.config.max_history

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D); row 0, the padding, is zero (its content and residual are)."""
        return self.project(self.content) + self.residual.weight

    def forward(
        self, item_ids: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) items [+ packed `segments`, `positions`] -> (B, L, D): the mean of each run's items so far."""
        item_ids = item_ids.to(self.content.device)
        vectors = self.item_embeddings()[item_ids]  # (B, L, D)
        if positions is None:  # left-padded histories: one run per row, padding contributes zeros
            real = (item_ids != 0).cumsum(dim=1).clamp(min=1)
            return vectors.cumsum(dim=1) / real[..., None]
        sums = vectors.cumsum(dim=1)
        start = torch.arange(item_ids.shape[1], device=item_ids.device) - positions  # (B, L) each run's first column
        previous = sums.gather(1, (start - 1).clamp(min=0)[..., None].expand_as(sums))  # the sum before each run
        before = torch.where(start[..., None] > 0, previous, 0)
        return (sums - before) / (positions + 1)[..., None]

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D) user vectors."""
        return self(histories)[:, -1]

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        return self.encode_queries(histories) @ self.item_embeddings().T


def _build(fields: dict[str, Any], inputs: ModelInputs) -> ContentPool:
    content = content_of(inputs, fields["num_items"])
    return ContentPool(FAMILY.validate({**fields, "content_dim": content.shape[1]}), content)


FAMILY = register_family(
    ModelFamily(
        "content_pool", ContentPoolConfig, ContentPool, _build, training="next_item",
        reads=lambda config: frozenset({Input.CONTENT}), filled={"num_items": 1, "content_dim": 0},
    )
)  # fmt: skip


def test_packed_runs_pool_like_left_padded_histories() -> None:
    content = torch.cat([torch.zeros(1, 3), torch.randn(5, 3)])  # row 0: the padding item
    model = ContentPool(ContentPoolConfig(num_items=5, content_dim=3, dim=4), content)
    packed = model(torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 1, 2, 2, 2]]), torch.tensor([[0, 1, 0, 1, 2]]))
    torch.testing.assert_close(packed[0, 1], model(torch.tensor([[0, 1, 2]]))[0, -1])
    torch.testing.assert_close(packed[0, 4], model(torch.tensor([[3, 4, 5]]))[0, -1])


@pytest.fixture(scope="module")
def trained_pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """`recsys pipeline run` of an experiment of the family: (the config's path, the pipeline's state file)."""
    work = tmp_path_factory.mktemp("content-pool")
    config = {
        "name": "content-pool",
        "data": {"source": "synthetic", "options": dict(TINY_SYNTHETIC)},
        "content": {"text_fields": ["title"]},
        "model": {"name": "content_pool", "params": {"dim": 16}},
        "train": {"schedule": {"epochs": 4, "patience": 4}, "optimization": {"batch_size": 8, "lr": 0.01}},
        "tracking": {"uri": f"sqlite:///{work / 'mlflow.db'}"},
        "pipeline": {"index": {"kind": "flat"}, "registry": {"gate": "point"}},
    }
    path = work / "content-pool.yaml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(app, ["pipeline", "run", "--config", str(path), "--work-dir", str(work)])
    assert result.exit_code == 0, result.output
    return path, json.loads((work / "pipelines" / "content-pool" / STATE_FILE).read_text())


def test_the_pipeline_runs_every_step_the_family_needs(trained_pipeline: tuple[Path, dict[str, Any]]) -> None:
    _, state = trained_pipeline
    # content read: embedded; no sid section: no semantic IDs; item vectors: indexed; tracking on: registered
    assert list(state) == ["prepare_data", "embed_content", "train_retriever", "build_index", "evaluate", "register"]
    assert state["train_retriever"]["outputs"]["item_vectors"] is True
    assert state["register"]["outputs"]["decision"]["promoted"] is True


@pytest.fixture(scope="module")
def api(trained_pipeline: tuple[Path, dict[str, Any]]) -> Iterator[httpx.Client]:
    """The online API over the registered champion, on a free loopback port: real HTTP."""
    config = load_config(trained_pipeline[0])
    settings = ServingSettings(
        model_name=config.registered_model_name, tracking_uri=config.tracking.resolved_uri(), reload_interval_s=0
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_the_api_serves_the_family(api: httpx.Client) -> None:
    assert api.get("/readyz").status_code == 200
    found = api.post("/v1/recommendations", json={"user_id": "u00001", "k": 5})
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["source"] == "model" and len(body["items"]) == 5
    scores = [item["score"] for item in body["items"]]
    assert scores == sorted(scores, reverse=True)
    similar = api.get(f"/v1/similar-items/{body['items'][0]['item_id']}", params={"k": 3})
    assert similar.status_code == 200 and len(similar.json()["items"]) == 3  # through the FAISS index it was given
    assert api.post("/v1/search", json={"query": "anything", "k": 3}).status_code == 409  # it reads no queries
