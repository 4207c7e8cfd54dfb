"""The new-item prior benchmark end to end on its smoke config: the cold-start comparisons' runs are trained by the
pipeline, each one's validation curve starts at the model's own metrics, the rules pick offsets within their bounds,
and the test metrics at them are paired against the reference on the same users."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.new_item_prior as new_item_prior
from benchmarks.reproduce import problems_of

SMOKE = "benchmarks/configs/new-item-prior-smoke.yaml"


def test_the_smoke_prior_is_chosen_on_validation_and_paired_on_test(tmp_path: Path) -> None:
    work = tmp_path / "work"
    argv = ["--config", SMOKE, "--results-dir", str(tmp_path), "--set", "priors=[0.0, 1.0, 4.0, 50.0]",
            "--set", f"comparisons_overrides={{work_dir: {work}}}"]  # fmt: skip
    outside = tmp_path / "cold-start.yaml"
    outside.write_text(Path("benchmarks/configs/cold-start-smoke.yaml").read_text())
    with pytest.raises(SystemExit, match="not a file in the repo"):  # a result comes from configs in the repo only
        new_item_prior.main([*argv, "--set", f"comparisons={outside}"])
    path = new_item_prior.main([*argv, "--set", "warm_tolerance=0.05"])
    assert path == tmp_path / "new-item-prior-smoke.json" and problems_of(path) == []
    result = json.loads(path.read_text())
    record = result["models"]["content-first"]
    assert len(record["per_seed"]) == 2
    for run in record["per_seed"]:
        trained = json.loads((Path(run["model_dir"]) / "metrics.json").read_text())
        curve = {row["prior"]: row for row in run["valid"]}
        assert curve[0.0]["ndcg@10"] == pytest.approx(trained["valid"]["ndcg@10"])  # offset 0: the model's own
        assert curve[0.0]["cold.recall@10"] == pytest.approx(trained["valid_cold"]["recall@10"])
        assert curve[50.0]["cold.recall@50"] >= curve[0.0]["cold.recall@50"]  # the new items first
        tolerance = run["prior"]["tolerance"]
        assert curve[tolerance]["warm.ndcg@10"] >= 0.95 * curve[0.0]["warm.ndcg@10"]
        assert run["prior"]["overall"] == max(curve, key=lambda prior: curve[prior]["ndcg@10"])
        reference = run["reference_valid_warm_ndcg@10"]  # ID-only SASRec's own, from its run's metrics.json
        passing = [prior for prior in curve if curve[prior]["warm.ndcg@10"] >= 0.95 * reference]
        assert run["prior"]["reference"] == max(passing, default=0.0)
        for rule in ("tolerance", "reference", "overall"):
            pairs = run["pairs"][rule]
            assert set(pairs) == {"cold.recall@10", "cold.recall@50", "warm.ndcg@10", "ndcg@10"}
            assert pairs["cold.recall@10"]["users"] < pairs["ndcg@10"]["users"]  # the cold users' slice
            cold = pairs["cold.recall@10"]
            assert cold["low"] <= cold["difference"] <= cold["high"]
    for rule in ("tolerance", "reference", "overall"):
        assert record["test"][rule]["ndcg@10"]["seeds"] == 2 and record["pairs"][rule]["ndcg@10"]["seeds"] == 2
    with pytest.raises(SystemExit, match="lack 0"):
        new_item_prior.main([*argv, "--set", "priors=[1.0]"])
    with pytest.raises(SystemExit, match="not a model of"):
        new_item_prior.main([*argv, "--set", "models=[nothing]"])
