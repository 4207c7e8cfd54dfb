"""The compile-speedup benchmark at its smallest (the smoke config, SASRec only): every variant timed, the graph count
across 20 history lengths, the skipped modes with their reason; the JSON has its fields and how to reproduce it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import benchmarks.compile_speedup as compile_speedup
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of

CONFIG = "benchmarks/configs/compile-speedup.yaml"
SMOKE = "benchmarks/configs/compile-speedup-smoke.yaml"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's (torch.jit.script_method)
def test_smoke_run_times_every_variant_and_counts_graphs(tmp_path: Path) -> None:
    overrides = {"models": ["sasrec"]}
    sets = ["--set", "models=[sasrec]"]
    path = compile_speedup.main(["--config", str(REPO / SMOKE), *sets, "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path.name == "compile-speedup-cpu.json" and result["device"] == "cpu"
    assert result["config"] == {
        "items": 200, "rows": 4, "max_history": 32, "steps": 2, "warmup": 1, "bf16_autocast": False,
        "loss": "full softmax", "backend": "aot_eager", "modes": ["default", "max-autotune"],
        "count_lengths": [8, 9, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 24, 26, 27, 28, 29, 31, 32],
        "count_rows": [4, 2],
    }  # fmt: skip
    figures = result["models"]["sasrec"]
    assert list(figures["step_ms"]) == ["eager", "static", "dynamic"] and min(figures["step_ms"].values()) > 0
    assert list(figures["speedup_over_eager"]) == list(figures["first_step_s"]) == ["static", "dynamic"]
    assert figures["graphs"] == {"packed_rows": 1, "histories": 1}  # no recompilation across the 20 lengths
    assert result["not_measured_yet"] == []  # every model of the config: the run was not cut off
    assert result["skipped"] == {"max-autotune": "backend aot_eager: compile modes are inductor's"}
    assert {"machine", "versions", "command", "date", "settings"} <= set(result)
    assert result["reproduce"] == {"benchmark": "benchmarks.compile_speedup", "config": SMOKE, "overrides": overrides}
    assert problems_of(path) == []


def test_modes_other_than_the_default_are_timed_on_cuda_with_inductor_only() -> None:
    settings = compile_speedup.load_settings(REPO / CONFIG, {})
    assert settings.backend == "inductor" and settings.modes == ("default", "max-autotune")
    cuda = compile_speedup.variants(settings, torch.device("cuda"))
    cpu = compile_speedup.variants(settings, torch.device("cpu"))
    assert list(cuda[0]) == ["eager", "static", "dynamic", "dynamic max-autotune"] and cuda[1] == {}
    assert list(cpu[0]) == ["eager", "static", "dynamic"] and list(cpu[1]) == ["max-autotune"]


def test_the_recorded_runs_reproduce_from_the_config() -> None:
    """The CUDA run was cut off by its device call after two models and names the third as not measured; a second
    run measured that one alone."""
    cuda = json.loads((REPO / "benchmarks/results/compile-speedup-cuda.json").read_text())
    models = list(compile_speedup.load_settings(REPO / CONFIG, {}).models)
    assert list(cuda["models"]) + cuda["not_measured_yet"] == models and cuda["not_measured_yet"]
    for path in (
        "compile-speedup-cuda.json",
        "compile-speedup-cpu.json",
        "compile-speedup-time-buckets/compile-speedup-cuda.json",
    ):
        assert problems_of(REPO / "benchmarks/results" / path) == []


def test_a_result_missing_a_model_it_does_not_name_fails_the_check() -> None:
    cuda = json.loads((REPO / "benchmarks/results/compile-speedup-cuda.json").read_text())
    settings = compile_speedup.load_settings(REPO / CONFIG, {})
    assert list(compile_speedup.recorded_mismatches(cuda, settings)) == []
    silent = {**cuda, "not_measured_yet": []}
    assert [m for m in compile_speedup.recorded_mismatches(silent, settings) if m.startswith("models")]


def test_too_many_lengths_for_the_window_is_refused() -> None:
    settings = compile_speedup.load_settings(REPO / SMOKE, {"max_history": 16})
    with pytest.raises(ValueError, match="lengths=20 distinct history lengths from shortest=8 to max_history=16"):
        compile_speedup.count_lengths(settings)
