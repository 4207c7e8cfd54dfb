"""The cold-compile benchmark at its smallest (the smoke config: SASRec, aot_eager, one process per floats setting):
the trainer's compilation analyses the step once, dynamo's default twice; the JSON has its fields and reproduces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.cold_compile as cold_compile
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of

SMOKE = "benchmarks/configs/cold-compile-smoke.yaml"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's (torch.jit.script_method)
def test_smoke_run_times_each_floats_setting_in_processes_of_their_own(tmp_path: Path) -> None:
    path = cold_compile.main(["--config", str(REPO / SMOKE), "--results-dir", str(tmp_path)])
    assert path is not None and path.name == "cold-compile-cpu.json"
    result = json.loads(path.read_text())
    figures = result["models"]["SASRec"]
    assert list(result["models"]) == ["SASRec"] and result["device"] == "cpu" and result["bf16_autocast"] is False
    assert figures["analyses"] == {"specialised": [1], "symbolic": [2]}  # the symbolic floats restart the analysis
    assert all(len(runs) == 1 and runs[0] > 0 for runs in figures["runs_s"].values())
    assert figures["speedup"] == pytest.approx(
        figures["first_step_s"]["symbolic"] / figures["first_step_s"]["specialised"], rel=0.01
    )
    assert {"machine", "versions", "command", "date", "settings"} <= set(result)
    assert result["reproduce"] == {"benchmark": "benchmarks.cold_compile", "config": SMOKE, "overrides": {}}
    assert problems_of(path) == []


def test_the_generative_model_is_built_on_unique_codes_of_its_configs_levels() -> None:
    settings = cold_compile.load_settings(REPO / SMOKE, {"items": 300})
    model, family = cold_compile.build(settings, "configs/beauty/generative.yaml")
    codes = model.codes[1:]  # type: ignore[index]
    assert family == "generative" and tuple(codes.shape) == (300, 4)
    assert len({tuple(row) for row in codes.tolist()}) == 300 and (model.codes[0] == -1).all()  # type: ignore[index]


def test_a_model_whose_step_it_cannot_take_is_refused_with_the_families_it_can() -> None:
    settings = cold_compile.load_settings(REPO / SMOKE, {})
    with pytest.raises(SystemExit, match="sasrec, hstu, generative"):
        cold_compile.build(settings, "configs/beauty/two-tower-next-item.yaml")
