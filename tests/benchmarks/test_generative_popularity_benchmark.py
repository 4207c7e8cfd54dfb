"""The generative popularity benchmark on generated data: the correction chosen on validation from the trained
weights, alpha 0 giving back what the pipeline measured, the test figures paired against the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import generative_popularity
from benchmarks.reproduce import problems_of

SMOKE = "benchmarks/configs/generative-popularity-smoke.yaml"


def test_alpha_is_chosen_on_validation_and_alpha_0_is_the_model_as_trained(tmp_path: Path) -> None:
    argv = ["--config", SMOKE, "--set", f"comparisons_overrides.work_dir={tmp_path / 'work'}",
            "--results-dir", str(tmp_path)]  # fmt: skip
    path = generative_popularity.main(argv)
    result = json.loads(path.read_text())
    (seed,) = result["per_seed"]
    curve = seed["valid"]
    assert [point["alpha"] for point in curve] == [0.0, 0.5, 1.0]
    assert seed["alpha"] == max(curve, key=lambda point: point["ndcg@10"])["alpha"]
    trained = json.loads((Path(seed["model_dir"]) / "metrics.json").read_text())  # what the pipeline measured
    assert curve[0]["ndcg@10"] == pytest.approx(trained["valid"]["ndcg@10"])
    assert seed["test"]["none"]["ndcg@10"] == pytest.approx(trained["test"]["ndcg@10"])
    assert curve[1]["ndcg@10"] != curve[0]["ndcg@10"]  # the correction reorders the beams
    for at in ("chosen", "none"):
        pair = seed["pairs"][at]["ndcg@10"]
        assert pair["low"] <= pair["difference"] <= pair["high"] and pair["users"] == 300
        assert result["pairs"][at]["ndcg@10"]["seeds"] == 1
    assert problems_of(path) == []
    with pytest.raises(SystemExit, match=r"'TIGER' is not a model of .*Fix: one of \['SASRec', 'generative'\]"):
        generative_popularity.main([*argv, "--set", "model=TIGER"])
    with pytest.raises(SystemExit, match=r"0 \(the model as trained\) among them"):
        generative_popularity.main([*argv, "--set", "alphas=[0.5]"])
