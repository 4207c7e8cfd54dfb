"""The serving load test, short, on the synthetic config made tiny: wrk against a real `recsys serve` of one and of
two worker processes sharing a real Redis, and of a trained model directory (--model-dir); the results reproduce from
their config."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import benchmarks.serving as serving
from benchmarks.reproduce import problems_of
from benchmarks.serving_load import serve
from pipelines.config import load_config
from tests.conftest import train_experiment

CONFIG = "configs/synthetic/sasrec.yaml"

TINY = {
    "data.options.num_users": 300,
    "data.options.num_items": 150,
    "model.params.max_history": 20,
    "model.params.dim": 32,
    "model.params.num_heads": 1,
    "model.params.ffn_dim": 64,
    "train.schedule.epochs": 1,
}


def need_wrk() -> None:
    if shutil.which("wrk") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs wrk (.ci/run installs it)")
        pytest.skip("wrk is not installed (apt-get install -y wrk)")


def test_short_load_test_writes_the_issue_fields(tmp_path: Path) -> None:
    need_wrk()
    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    args = ["--config", "configs/synthetic/sasrec.yaml", *sets, "--work-dir", str(tmp_path / "work"),
            "--duration", "2", "--connections", "2", "--model-calls", "20", "--freshness-trials", "10",
            "--workers", "1", "2", "--history-store", "redis", "--results-dir", str(tmp_path)]  # fmt: skip
    path = serving.main(args)
    result = json.loads(path.read_text())
    assert path.name == "serving-synthetic-redis.json" and result["name"] == "serving-synthetic-redis"
    assert [run["workers"] for run in result["runs"]] == [1, 2]
    for run in result["runs"]:
        assert run["requests"] > 0 and run["requests_per_second"] > 0 and run["errors"] == 0
        assert 0 < run["latency_ms"]["p50"] <= run["latency_ms"]["p95"] <= run["latency_ms"]["p99"]
        swap = run["hot_swap"]  # the admin reload or a worker's own check (every second) swapped it in
        assert swap["errors"] == 0 and swap["every_worker_serves_it"]
    assert [run["hot_swap"]["promoted_version"] for run in result["runs"]] == ["2", "3"]
    assert 0 < result["model_call_ms"]["p50"] <= result["model_call_ms"]["p99"]
    assert 0 < result["freshness_ms"]["p50"] <= result["freshness_ms"]["p99"]
    one = result["runs"][0]
    batching = one["server_batching"]  # every wrk request went through a model call (the mean has 4 digits)
    assert batching["model_calls"] * batching["mean_requests_per_call"] >= one["requests"] * (1 - 5e-4)
    assert batching["mean_requests_per_call"] >= 1 and batching["mean_model_call_ms"] > 0
    assert not {"server_batching", "full_collections"} & set(result["runs"][1])  # each worker counts its own
    collections = one["full_collections"]  # during the load, read from the server's /metrics before and after it
    assert collections["count"] >= 0 and (collections["pause_ms"] > 0) == (collections["count"] > 0)
    assert {"concurrency", "machine", "command"} <= set(result)
    assert result["load_test"] == {
        "duration_s": 2, "connections": 2, "model_calls": 20, "freshness_trials": 10, "workers": [1, 2],
        "history_store": "redis",
    }  # fmt: skip
    assert result["bundle"]["index"] == "hnsw" and result["bundle"]["train_epochs"] == 1
    assert result["settings"]["model"]["params"]["dim"] == 32

    # every --set, and the benchmark's own HNSW index, are the result's overrides
    assert result["reproduce"] == {
        "benchmark": "benchmarks.serving",
        "config": "configs/synthetic/sasrec.yaml",
        "overrides": {"pipeline.index.kind": "hnsw", **TINY},
    }
    assert problems_of(path) == []


# the served index: IVF-PQ with fast-scan codes and an exact re-rank, 4 cells
FAST_SCAN = {
    "pipeline.index.kind": "ivf_pq", "pipeline.index.nlist": 4, "pipeline.index.pq_m": 8, "pipeline.index.pq_nbits": 4,
    "pipeline.index.fast_scan": True, "pipeline.index.refine_k_factor": 2,
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_sasrec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SASRec's model directory (read-only for the tests: served, or a ranker's retriever)."""
    config = load_config(Path(CONFIG), {**TINY, "tracking.enabled": False, "train.progress": False})
    return train_experiment(config, tmp_path_factory.mktemp("sasrec")).model_dir


def test_model_dir_run_reports_startup_memory_and_both_routes(tmp_path: Path, tiny_sasrec_dir: Path) -> None:
    need_wrk()
    model_dir = tiny_sasrec_dir
    overrides = {**TINY, **FAST_SCAN}
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={str(value).lower()}")]
    args = ["--config", CONFIG, *sets, "--model-dir", str(model_dir), "--work-dir", str(tmp_path / "work"),
            "--duration", "1", "--connections", "2", "--results-dir", str(tmp_path)]  # fmt: skip
    path = serving.main(args)
    result = json.loads(path.read_text())
    bundle = result["bundle"]
    assert path.name == f"serving-synthetic-{bundle['items']}.json" and bundle["model_dir"] == str(model_dir)
    assert bundle["index"] == bundle["index_build"]["kind"] == "ivf_pq" and bundle["train_epochs"] == "model dir"
    assert 0 < bundle["index_build"]["recall"] <= 1 and bundle["index_build"]["k"] == 100
    (run,) = result["runs"]
    assert run["workers"] == 1 and run["startup_s"] > 0
    assert 100 < run["rss_mib"]["ready"] <= run["rss_mib"]["peak_under_load"] * 1.05  # a Python server with torch
    for route in ("recommendations", "similar_items"):
        load = run[route]
        assert load["requests"] > 0 and load["errors"] == 0, route  # non-2xx answers count as errors
        assert 0 < load["latency_ms"]["p50"] <= load["latency_ms"]["p99"]
    assert result["reproduce"] == {"benchmark": "benchmarks.serving", "config": CONFIG,
                                   "overrides": {"pipeline.index.kind": "hnsw", **overrides}}  # fmt: skip
    assert problems_of(path) == []

    baseline_config = load_config(
        Path(CONFIG), {**TINY, "name": "synthetic-baseline", "tracking.enabled": False, "train.progress": False}
    )
    baseline_dir = train_experiment(baseline_config, tmp_path / "baseline").model_dir
    # another work dir: a fresh registry (the first run's SQLite engine stays open in this process)
    compare = [*args, "--work-dir", str(tmp_path / "compare"), "--baseline-model-dir", str(baseline_dir)]
    compared = serving.main([*compare, "--rounds", "2"])
    against = json.loads(compared.read_text())["against_baseline"]
    assert against["baseline"] == "synthetic-baseline" and against["rounds"] == 2 and against["workers"] == 1
    for role in ("model", "baseline"):
        assert len(against["runs"][role]) == 2 and against["medians"][role]["errors"] == 0
        assert all(run["requests"] > 0 for run in against["runs"][role])
        # the server's full collections during each load, from its /metrics (the loaded model is exempt from them)
        assert all(set(run["full_collections"]) == {"count", "pause_ms"} for run in against["runs"][role])
    medians = against["medians"]
    assert against["throughput_ratio"] == pytest.approx(
        medians["model"]["requests_per_second"] / medians["baseline"]["requests_per_second"], rel=1e-2
    )
    with pytest.raises(SystemExit, match="as --model-dir does"):
        serving.main([*args, "--work-dir", str(tmp_path / "same"), "--baseline-model-dir", str(model_dir)])

    # rounds of two-worker servers share users' events through Redis; their /metrics are per worker: no collections
    two = [*args, "--work-dir", str(tmp_path / "two"), "--baseline-model-dir", str(baseline_dir), "--rounds", "1"]
    with pytest.raises(SystemExit, match="through Redis"):
        serving.main([*two, "--round-workers", "2"])
    two_workers = serving.main([*two, "--round-workers", "2", "--history-store", "redis"])
    against = json.loads(two_workers.read_text())["against_baseline"]
    assert (
        against["workers"] == 2
        and against["medians"]["model"]["errors"] == against["medians"]["baseline"]["errors"] == 0
    )
    assert all("full_collections" not in run for runs in against["runs"].values() for run in runs)

    other_model = [*args, "--set", "model.params.dim=16"]  # not what the model directory was trained with
    with pytest.raises(SystemExit, match=r"was trained with another model\.params"):
        serving.main(other_model)


def test_a_model_dir_without_item_vectors_is_served_without_an_index(tmp_path: Path, tiny_sasrec_dir: Path) -> None:
    need_wrk()
    retriever_dir = tiny_sasrec_dir
    ranking = "configs/synthetic/ranker-residual.yaml"
    shape = {key: value for key, value in TINY.items() if key != "model.params.ffn_dim"}  # a SASRec's alone
    overrides = {**shape, "model.params.num_candidates": 50, "model.params.use_content": False,
                 "model.upstream.retriever": str(retriever_dir), "model.upstream.holdout_retriever": None}  # fmt: skip
    config = load_config(Path(ranking), {**overrides, "tracking.enabled": False, "train.progress": False})
    model_dir = train_experiment(config, tmp_path / "ranker").model_dir
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
    path = serving.main(["--config", ranking, *sets, "--model-dir", str(model_dir), "--work-dir", str(tmp_path / "w"),
                         "--duration", "1", "--connections", "2", "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())
    assert result["bundle"]["model"] == "ranker" and result["bundle"]["index_build"] is None  # no item vectors
    assert not (tmp_path / "w" / "indexes").exists() and problems_of(path) == []
    (run,) = result["runs"]
    assert "similar_items" not in run  # nothing to answer them from
    assert run["recommendations"]["requests"] > 0 and run["recommendations"]["errors"] == 0


def test_an_error_while_serving_carries_the_servers_last_log_lines(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'absent.db'}"  # no such store: `recsys serve` refuses it and exits
    with (
        pytest.raises(SystemExit, match="did not become ready") as caught,
        serve("no-such-model", store, 1, "memory", "redis://127.0.0.1:6379/0"),
    ):
        pass
    notes = "\n".join(caught.value.__notes__)
    assert notes.startswith("the server's last log lines:") and "absent.db" in notes
