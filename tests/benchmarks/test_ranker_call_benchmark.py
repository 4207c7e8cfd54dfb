"""benchmarks.ranker_call times a real multi-source ranker's call against its first stage's, per width and batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import ranker_call
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of
from recsys.data.prepared import load_prepared
from recsys.errors import ConfigError
from recsys.models.family import ModelInputs, Upstream
from recsys.models.registry import build_model, load_model, save_model
from recsys.models.sasrec import SASRec, SASRecConfig

CONFIG = "benchmarks/configs/ranker-call.yaml"


@pytest.fixture(scope="module")
def model_dirs(tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An untrained SASRec and a ranker over three sources on it, saved as model directories (cost is shape's)."""
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    first, ranker = tmp_path_factory.mktemp("sasrec"), tmp_path_factory.mktemp("ranker")
    save_model(first / "model.pt", SASRec(SASRecConfig(num_items=data.num_items, max_history=20, dim=32)))
    content = torch.cat([torch.zeros(1, 8), torch.randn(data.num_items, 8)])
    counts = data.item_counts().clone()
    counts[[3, 7]] = 0
    inputs = ModelInputs(retriever=Upstream(*load_model(first / "model.pt")), content=content, item_counts=counts)
    sources = [{"kind": "retriever", "top": 20}, {"kind": "content", "top": 10, "recent": 3},
               {"kind": "new_items", "top": 2}]  # fmt: skip
    params = {"dim": 32, "hidden": 32, "use_content": True, "residual": True, "sources": sources}
    save_model(ranker / "model.pt", build_model("ranker", params, data.num_items, inputs))
    return ranker, first


def _run(tmp_path: Path, model_dirs: tuple[Path, Path], *sets: str) -> dict:
    ranker, first = model_dirs
    argv = ["--config", str(REPO / CONFIG), "--results-dir", str(tmp_path), "--set", f"model_dir={ranker}",
            "--set", f"baseline_model_dir={first}", "--set", "repeats=3", *sets]  # fmt: skip
    return json.loads(ranker_call.main(argv).read_text())


def test_each_width_and_batch_is_timed_with_its_sources_and_the_union_narrows(
    tmp_path: Path, model_dirs: tuple[Path, Path]
) -> None:
    result = _run(tmp_path, model_dirs, "--set", "widths=[null, [5, 3, 1]]", "--set", "batch_sizes=[1, 4]")

    assert result["sources"] == ["retriever", "content", "new_items"]
    rows = {(tuple(row["tops"]), row["batch"]): row for row in result["rows"]}
    assert set(rows) == {((20, 10, 2), 1), ((20, 10, 2), 4), ((5, 3, 1), 1), ((5, 3, 1), 4)}
    for (tops, _), row in rows.items():
        assert 0 < row["candidates"] <= sum(tops)
        assert row["ranker_ms"] > 0 and row["baseline_ms"] > 0 and row["ranking_ms"] > 0
        assert row["ratio"] == pytest.approx(row["ranker_ms"] / row["baseline_ms"], rel=1e-2)
        assert set(row["sources_ms"]) == {"retriever", "content", "new_items"}
    assert rows[((5, 3, 1), 4)]["candidates"] < rows[((20, 10, 2), 4)]["candidates"]
    assert result["torch_threads"] == 2 and problems_of(tmp_path / "ranker-call-beauty-four-sources.json") == []


def test_a_width_per_source_and_a_ranker_with_sources_are_required(
    tmp_path: Path, model_dirs: tuple[Path, Path]
) -> None:
    with pytest.raises(ConfigError, match="one top-N per source"):
        _run(tmp_path, model_dirs, "--set", "widths=[[5, 3]]")
    first = model_dirs[1]
    with pytest.raises(ConfigError, match="does not hold a ranker over candidate sources"):
        _run(tmp_path, (first, first))
