"""The generative decoding benchmark on generated data: the (popularity correction, retrieval weight) chosen on
validation from the trained weights, the trained setting giving back what the pipeline measured, the test figures
paired against the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import generative_decoding
from benchmarks.reproduce import problems_of

SMOKE = "benchmarks/configs/generative-decoding-smoke.yaml"


def test_the_decoding_is_chosen_on_validation_and_the_trained_setting_is_the_model_as_trained(
    tmp_path: Path,
) -> None:
    argv = ["--config", SMOKE, "--set", f"comparisons_overrides.work_dir={tmp_path / 'work'}",
            "--results-dir", str(tmp_path)]  # fmt: skip
    path = generative_decoding.main(argv)
    result = json.loads(path.read_text())
    (seed,) = result["per_seed"]
    curve = seed["valid"]
    grid = [tuple(point[name] for name in generative_decoding.SETTINGS) for point in curve]
    weights_and_candidates = [(w, k) for w in (0.0, 1.0, 4.0) for k in (2, 5)]  # 1.0 and 5: as trained
    assert grid == [(alpha, w, k) for alpha in (0.0, 0.5) for w, k in weights_and_candidates]
    best = max(curve, key=lambda point: point["ndcg@10"])
    assert seed["chosen"] == {name: best[name] for name in generative_decoding.SETTINGS}
    assert seed["as_trained"] == {"popularity_correction": 0.0, "retrieval_weight": 1.0, "retrieval_candidates": 5}
    trained = json.loads((Path(seed["model_dir"]) / "metrics.json").read_text())  # what the pipeline measured
    assert curve[3]["ndcg@10"] == pytest.approx(trained["valid"]["ndcg@10"])
    assert seed["test"]["as_trained"]["ndcg@10"] == pytest.approx(trained["test"]["ndcg@10"])
    assert len({point["ndcg@10"] for point in curve[:6]}) > 1  # the weight and candidates reorder the lists
    for at in generative_decoding.AT:
        pair = seed["pairs"][at]["ndcg@10"]
        assert pair["low"] <= pair["difference"] <= pair["high"] and pair["users"] == 300
        assert result["pairs"][at]["ndcg@10"]["seeds"] == 1
    assert result["retrieval_weight"]["mean"] == seed["chosen"]["retrieval_weight"]
    assert problems_of(path) == []
    with pytest.raises(SystemExit, match=r"'TIGER' is not a model of .*Fix: one of \['SASRec', 'generative'\]"):
        generative_decoding.main([*argv, "--set", "model=TIGER"])
    with pytest.raises(SystemExit, match=r"0 \(the model as trained\) among them"):
        generative_decoding.main([*argv, "--set", "alphas=[0.5]"])
    with pytest.raises(SystemExit, match=r"retrieval_weights \[-1.0\]: give values >= 0"):
        generative_decoding.main([*argv, "--set", "retrieval_weights=[-1.0]"])
    with pytest.raises(SystemExit, match=r"retrieval_candidates \[0\]: give values >= 1"):
        generative_decoding.main([*argv, "--set", "retrieval_candidates=[0]"])


def test_retrieval_weights_need_a_model_with_the_retrieval_head(tmp_path: Path) -> None:
    models = [{"label": "SASRec", "config": "configs/synthetic/sasrec.yaml", "overrides": {"name": "smoke-sasrec"}},
              {"label": "generative", "config": "configs/synthetic/generative.yaml",
               "overrides": {"name": "smoke-generative"}}]  # fmt: skip
    argv = ["--config", SMOKE, "--set", f"comparisons_overrides.work_dir={tmp_path / 'work'}",
            "--set", f"comparisons_overrides.models={json.dumps(models)}", "--results-dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit, match=r"retrieval_candidates need a model trained with the retrieval head"):
        generative_decoding.main(argv)
