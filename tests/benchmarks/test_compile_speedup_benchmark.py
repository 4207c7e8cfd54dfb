"""The compile-speedup benchmark at its smallest: SASRec eager vs compiled for 2 steps on CPU; the JSON has its
fields and how to reproduce it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.compile_speedup as compile_speedup
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of

CONFIG = "configs/benchmarks/compile-speedup.yaml"
SMALLEST = {"device": "cpu", "steps": 2, "warmup": 1, "models": ["sasrec"], "items": 200, "rows": 2, "max_history": 10}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's (torch.jit.script_method)
def test_smallest_run_times_eager_and_compiled(tmp_path: Path) -> None:
    sets = [arg for key, value in SMALLEST.items() for arg in ("--set", f"{key}={value}")]
    path = compile_speedup.main(["--config", str(REPO / CONFIG), *sets, "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert path.name == "compile-speedup-cpu.json" and result["device"] == "cpu"
    assert result["config"] | {"bf16_autocast": None} == {
        "items": 200, "rows": 2, "max_history": 10, "steps": 2, "warmup": 1, "bf16_autocast": None,
        "loss": "full softmax",
    }  # fmt: skip
    assert list(result["models"]) == ["sasrec"]
    times = result["models"]["sasrec"]
    assert times["eager_ms"] > 0 and times["compiled_ms"] > 0 and times["speedup"] > 0
    assert {"machine", "versions", "command", "date"} <= set(result)
    assert result["reproduce"] == {"benchmark": "benchmarks.compile_speedup", "config": CONFIG, "overrides": SMALLEST}
    assert problems_of(path) == []


def test_the_recorded_runs_reproduce_from_the_config() -> None:
    """The CPU run timed SASRec and HSTU only (before time buckets), the CUDA run all three."""
    cpu_run = {"device": "cpu", "steps": 20, "models": ["sasrec", "hstu"]}  # compile-speedup-cpu.json's overrides
    settings = compile_speedup.load_settings(REPO / CONFIG, cpu_run)
    assert (settings.items, settings.rows, settings.max_history, settings.warmup) == (12_101, 16, 50, 5)
    cuda = json.loads((REPO / "benchmarks/results/compile-speedup-cuda.json").read_text())
    assert list(cuda["models"]) == list(compile_speedup.load_settings(REPO / CONFIG, {}).models)
