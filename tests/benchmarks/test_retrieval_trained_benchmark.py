"""The trained-vectors retrieval benchmark on a tiny trained SASRec: its item vectors and its users' query vectors,
every index setting measured against exact search in one run, the result reproducible from its config."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import benchmarks.retrieval_trained as retrieval_trained
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of
from pipelines.config import load_config
from pipelines.index import item_vectors, user_queries, vector_model
from recsys.artifacts.model_dir import load_model_dir
from tests.conftest import train_experiment

SMOKE = "benchmarks/configs/retrieval-trained-smoke.yaml"
PQ = "{kind: ivf_pq, nlist: 4, pq_m: 8, pq_nbits: 4, fast_scan: true, refine_k_factor: 2}"
INDEXES = (
    f"[{{index: {PQ}, knob: nprobe, values: [1, 4]}}, {{index: {PQ}, knob: refine_k_factor, values: [8]}}, "
    "{index: {kind: hnsw, hnsw_m: 8}, knob: ef_search, values: [32]}]"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> Path:
    work = tmp_path_factory.mktemp("retrieval-trained")
    config = load_config(tiny_config(work, tracking={"enabled": False}, train={"schedule": {"epochs": 1}}))
    return train_experiment(config, work).model_dir


def test_queries_are_a_seeded_sample_of_the_users_vectors(model_dir: Path) -> None:
    trained = load_model_dir(model_dir)
    model = vector_model(trained, model_dir)
    every_user = user_queries(model, trained.data, 10_000, seed=0)  # more than there are: all of them, in order
    assert every_user.shape == (trained.data.num_users, 32)
    sample = user_queries(model, trained.data, 40, seed=3)
    assert sample.shape == (40, 32) and torch.equal(sample, user_queries(model, trained.data, 40, seed=3))
    distances = torch.cdist(sample, every_user, compute_mode="donot_use_mm_for_euclid_dist")
    assert float(distances.min(dim=1).values.max()) < 1e-4  # each one a user's own vector
    assert not torch.equal(sample, user_queries(model, trained.data, 40, seed=4))
    vectors, ids = item_vectors(model)
    assert vectors.shape == (trained.data.num_items, 32) and ids.tolist() == list(range(1, trained.data.num_items + 1))


class Records(logging.Handler):
    """The messages of one logger (the benchmark resets the root logger's handlers, pytest's among them)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_small_run_measures_every_setting_against_exact_search(model_dir: Path, tmp_path: Path) -> None:
    sets = [f"model_dir={model_dir}", "queries=40", "k=20", "repeats=1", "target_recall=0.99", f"indexes={INDEXES}"]
    args = ["--config", str(REPO / SMOKE), *[arg for pair in sets for arg in ("--set", pair)]]
    builds, index_logger = Records(), logging.getLogger("recsys.retrieval.faiss_index")
    index_logger.addHandler(builds)
    try:
        path = retrieval_trained.main([*args, "--results-dir", str(tmp_path)])
    finally:
        index_logger.removeHandler(builds)
    result = json.loads(path.read_text())
    items = load_model_dir(model_dir).data.num_items
    assert path.name == f"retrieval-trained-{items}-smoke.json"
    data = result["data"]
    assert data["items"] == items and data["dim"] == 32 and data["queries"] == 40 and data["model"] == "sasrec"
    assert data["model_dir"] == str(model_dir) and len(data["model_sha256"]) == 64
    runs = result["runs"]
    assert [(r["knob"], r["value"]) for r in runs] == [("nprobe", 1), ("nprobe", 4), ("refine_k_factor", 8),
                                                       ("ef_search", 32)]  # fmt: skip
    assert runs[0]["recall"] < runs[1]["recall"]  # one cell of four misses items
    # every cell, and 8 x 20 candidates re-ranked exactly (more than the catalogue): exact search
    assert runs[2]["recall"] == 1.0 and runs[2]["config"]["nprobe"] >= 4
    built = [message.split(" over ")[0] for message in builds.messages if "vs exact on 40 queries" in message]
    assert built == ["FAISS ivf_pq fast-scan + refine", "FAISS hnsw"]  # the two IVF-PQ sweeps share one build
    assert runs[0]["build_seconds"] == runs[2]["build_seconds"]
    assert result["chosen"] == max((r for r in runs if r["recall"] >= 0.99), key=lambda r: r["queries_per_second"])
    assert result["exact"]["queries_per_second"] > 0
    assert result["reproduce"]["overrides"]["model_dir"] == str(model_dir)
    assert problems_of(path) == []


def test_a_run_without_a_model_dir_says_how_to_give_one(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--set model_dir=DIR"):
        retrieval_trained.main(["--config", str(REPO / SMOKE), "--results-dir", str(tmp_path)])
