"""The build_index step and `recsys index build`: a trained SASRec's item vectors in a real FAISS index."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cli import app
from pipelines.config import load_config
from pipelines.index import build_index_step
from recsys.artifacts.model_dir import load_model_dir
from recsys.errors import RecsysError
from recsys.retrieval import IndexConfig
from recsys.retrieval.faiss_index import FaissTopK
from tests.conftest import train_experiment


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> Path:
    work = tmp_path_factory.mktemp("index-step")
    config = load_config(tiny_config(work, tracking={"enabled": False}))
    return train_experiment(config, work).model_dir


def test_flat_index_returns_the_models_own_top_k(model_dir: Path, tmp_path: Path) -> None:
    index = FaissTopK.load(build_index_step(model_dir, tmp_path / "index", IndexConfig(kind="flat")))
    trained = load_model_dir(model_dir)
    model = trained.model.eval()
    assert index.report is not None and index.report.recall == 1.0
    assert index.report.num_items == trained.data.num_items and index.report.eval_queries == 300  # all users
    histories = trained.data.eval_split("test").histories.select(torch.arange(20)).to_padded(20)
    with torch.no_grad():
        expected = model.score(histories)[:, 1:].topk(10).indices + 1  # item indices, padding column dropped
        _, ids = index.search(model.encode_queries(histories), 10)  # type: ignore[operator]
    assert torch.equal(ids, expected)


def test_step_keeps_an_up_to_date_index_and_rebuilds_on_a_new_config(
    model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "index"
    build_index_step(model_dir, out, IndexConfig(kind="ivf_flat", nlist=4))
    written = (out / "index.faiss").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="pipelines.index"):
        build_index_step(model_dir, out, IndexConfig(kind="ivf_flat", nlist=4))
    assert (out / "index.faiss").stat().st_mtime_ns == written and "up to date" in caplog.text
    build_index_step(model_dir, out, IndexConfig(kind="ivf_flat", nlist=4, nprobe=1))
    assert FaissTopK.load(out).config.nprobe == 1


def test_a_model_without_item_vectors_is_refused(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = load_config(tiny_config(tmp_path, model={"name": "popularity", "params": {}}, tracking={"enabled": False}))
    popularity_dir = train_experiment(config, tmp_path).model_dir
    with pytest.raises(RecsysError, match="no item vectors to index"):
        build_index_step(popularity_dir, tmp_path / "index", IndexConfig())


def test_cli_builds_an_index_and_reports_bad_settings(model_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "hnsw"
    result = runner.invoke(app, ["index", "build", "--model-dir", str(model_dir), "--out", str(out), "--kind", "hnsw"])
    assert result.exit_code == 0, result.output
    assert "recall@100 vs exact (300 users)" in result.output and (out / "index.faiss").exists()
    result = runner.invoke(app, ["index", "build", "--model-dir", str(model_dir), "--out", str(out), "--kind", "annoy"])
    assert result.exit_code == 2 and "index kind must be" in result.output
    bad_pq = ["index", "build", "--model-dir", str(model_dir), "--out", str(out), "--kind", "ivf_pq", "--pq-m", "5"]
    result = runner.invoke(app, bad_pq)
    assert result.exit_code == 2 and "must divide the vector dim 32" in result.output
