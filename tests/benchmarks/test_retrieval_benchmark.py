"""The retrieval benchmark on a small catalog: every index setting is measured against exact search in one run, and
the JSON records the settings used and how to reproduce it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.retrieval as retrieval
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of
from recsys.errors import ConfigError

SMOKE = "benchmarks/configs/retrieval-faiss-smoke.yaml"


def test_small_run_writes_recall_and_qps_against_exact(tmp_path: Path) -> None:
    sets = ["items=3000", "queries=40", "k=20", "repeats=1", "target_recall=0.5", "centres=256", "noise=0.5"]
    args = ["--config", str(REPO / SMOKE), *[arg for pair in sets for arg in ("--set", pair)]]
    path = retrieval.main([*args, "--results-dir", str(tmp_path)])
    result = json.loads(Path(path).read_text())
    assert path.name == "retrieval-faiss-3k-smoke.json"
    assert result["data"]["items"] == 3000 and result["k"] == 20 and result["exact"]["queries_per_second"] > 0
    # the data actually generated, not fixed values
    assert result["data"]["centres"] == 256 and result["data"]["noise_sigma"] == 0.5
    assert [(r["kind"], r["value"]) for r in result["runs"]] == [("ivf_flat", 4), ("ivf_flat", 16), ("hnsw", 128)]
    for run in result["runs"]:
        assert 0.0 < run["recall"] <= 1.0 and run["queries_per_second"] > 0 and run["build_seconds"] >= 0
    reaching = [r for r in result["runs"] if r["recall"] >= 0.5]
    assert result["chosen"] == max(reaching, key=lambda r: r["queries_per_second"])
    assert {"machine", "versions", "command", "timer"} <= set(result)
    assert result["reproduce"] == {
        "benchmark": "benchmarks.retrieval",
        "config": SMOKE,
        "overrides": {"items": 3000, "queries": 40, "k": 20, "repeats": 1, "target_recall": 0.5, "centres": 256,
                      "noise": 0.5},
    }  # fmt: skip
    assert problems_of(path) == []
    result["data"]["noise_sigma"] = 0.6  # a result that no longer matches its record is found out
    path.write_text(json.dumps(result))
    assert problems_of(path) == ["data.noise_sigma: the result has 0.6, the config 0.5"]


def test_index_sweeps_refuse_unknown_keys_and_knobs() -> None:
    sweep = {"index": {"kind": "hnsw", "ef_serach": 64}, "knob": "ef_search", "values": [64]}
    with pytest.raises(ConfigError, match=r"indexes.0.index: .*unknown keys \['ef_serach'\]"):
        retrieval.load_settings(REPO / SMOKE, {"indexes": [sweep]})
    sweep = {"index": {"kind": "hnsw"}, "knob": "nprobe", "values": [4]}
    with pytest.raises(ConfigError, match="has no search-time knob 'nprobe'"):
        retrieval.load_settings(REPO / SMOKE, {"indexes": [sweep]})
    sweep = {"index": {"kind": "ivf_pq", "pq_m": 8}, "knob": "refine_k_factor", "values": [4]}
    with pytest.raises(ConfigError, match="has no search-time knob 'refine_k_factor'"):  # it re-ranks nothing
        retrieval.load_settings(REPO / SMOKE, {"indexes": [sweep]})
    sweep = {"index": {"kind": "ivf_flat"}, "knob": "nprobe", "values": [4, 8.5]}
    with pytest.raises(ConfigError, match=r"nprobe values must be integers, got \[4, 8.5\]"):
        retrieval.load_settings(REPO / SMOKE, {"indexes": [sweep]})
