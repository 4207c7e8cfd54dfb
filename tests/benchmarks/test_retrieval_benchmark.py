"""The retrieval benchmark on a small catalog: every index setting is measured against exact search in one run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.conftest import load_benchmark


def test_small_run_writes_recall_and_qps_against_exact(tmp_path: Path) -> None:
    module = load_benchmark("retrieval.py")

    args = ["--smoke", "--items", "3000", "--queries", "40", "--k", "20", "--repeats", "1", "--target-recall", "0.5"]
    path = module.main([*args, "--results-dir", str(tmp_path)])
    result = json.loads(Path(path).read_text())
    assert path.name == "retrieval-faiss-3k-smoke.json"
    assert result["data"]["items"] == 3000 and result["k"] == 20 and result["exact"]["queries_per_second"] > 0
    assert [(r["kind"], r["value"]) for r in result["runs"]] == [("ivf_flat", 4), ("ivf_flat", 16), ("hnsw", 128)]
    for run in result["runs"]:
        assert 0.0 < run["recall"] <= 1.0 and run["queries_per_second"] > 0 and run["build_seconds"] >= 0
    reaching = [r for r in result["runs"] if r["recall"] >= 0.5]
    assert result["chosen"] == max(reaching, key=lambda r: r["queries_per_second"])
    assert {"machine", "versions", "command", "timer"} <= set(result)
