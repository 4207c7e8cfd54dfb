"""The compile cache: what one process compiled, loaded by another before it compiles, makes its compilations hits
(real inductor, two processes, each with an inductor cache directory of its own, so only the file can help); a
file that does not load never fails a run; the trainer loads it before compiling, writes it after the first
validation and reports the time to its first step and first validation."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch import nn

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training import trainer
from recsys.training.compilation import compile_model
from recsys.training.compile_cache import load_compile_cache
from recsys.training.config import HardwareConfig, ScheduleConfig, TrainConfig
from recsys.training.trainer import fit

# a process that compiles a small module as the trainer does (forward and backward at two batch sizes) after
# loading the cache file if asked, writes it if asked, and prints its compile counters
COMPILE = """
import json, sys, torch
from torch._dynamo.utils import counters
from recsys.training.compilation import compile_model
from recsys.training.compile_cache import load_compile_cache, save_compile_cache
from pathlib import Path
path, action = Path(sys.argv[1]), sys.argv[2]
loaded = load_compile_cache(path) if action == "load" else None
class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
    def forward(self, x):
        return self.b(self.a(x).relu())
torch.manual_seed(0)
model = Small()
compile_model(model)
for rows in (8, 13):
    model(torch.randn(rows, 16)).sum().backward()
written = save_compile_cache(path) if action == "save" else None
print(json.dumps({"loaded": loaded, "written": written, "inductor": dict(counters["inductor"]),
                  "aot_autograd": dict(counters["aot_autograd"])}))
"""


def _compile_in_a_process(path: Path, action: str, inductor_dir: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir), "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(path), action], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_hits_what_the_first_compiled(tmp_path: Path) -> None:
    path = tmp_path / "model.compile-cache.bin"
    first = _compile_in_a_process(path, "save", tmp_path / "inductor-1")
    assert first["written"] and path.stat().st_size > 0
    assert first["inductor"].get("fxgraph_cache_hit", 0) == 0 and first["inductor"]["fxgraph_cache_miss"] > 0
    second = _compile_in_a_process(path, "load", tmp_path / "inductor-2")  # an empty inductor cache of its own
    assert second["loaded"] is True
    assert second["inductor"]["fxgraph_cache_hit"] == first["inductor"]["fxgraph_cache_miss"]
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["aot_autograd"].get("autograd_cache_hit", 0) > 0


def test_a_missing_or_broken_file_is_no_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert load_compile_cache(tmp_path / "absent.bin") is False
    broken = tmp_path / "broken.bin"
    broken.write_bytes(b"cut short")
    with caplog.at_level(logging.WARNING, logger="recsys.training.compile_cache"):
        assert load_compile_cache(broken) is False
    assert "compiling from scratch" in caplog.text


def test_the_trainer_uses_the_cache_around_compiling_and_times_its_first_step(
    tiny_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []

    def compiled(model: nn.Module, mode: str) -> None:
        events.append("compile")
        compile_model(model, mode, backend="aot_eager")  # the same graphs in seconds (test_compilation.py)

    def loaded(path: Path) -> bool:
        events.append(f"load {path.name}")
        return False

    def saved(path: Path) -> bool:
        events.append(f"save {path.name}")
        return True

    monkeypatch.setattr(trainer, "compile_model", compiled)
    monkeypatch.setattr(trainer, "load_compile_cache", loaded)
    monkeypatch.setattr(trainer, "save_compile_cache", saved)
    data = load_prepared(tiny_data_dir)
    model = SASRec(SASRecConfig(data.num_items, max_history=20, dim=16, num_heads=1, num_layers=1, ffn_dim=32))
    config = TrainConfig(schedule=ScheduleConfig(epochs=2), hardware=HardwareConfig(compile=True), progress=False)
    start = time.perf_counter()
    result = fit(model, data, config, EvalConfig(ks=(10,)), compile_cache=tmp_path / "c.bin")
    wall = time.perf_counter() - start
    assert events == ["load c.bin", "compile", "save c.bin"]  # loaded before compiling; written once, after epoch 1
    assert result.first_step_seconds is not None and result.first_validation_seconds is not None
    assert 0 < result.first_step_seconds < result.first_validation_seconds < wall
    events.clear()
    eager = TrainConfig(schedule=ScheduleConfig(epochs=1), progress=False)
    fit(model, data, eager, EvalConfig(ks=(10,)), compile_cache=tmp_path / "c.bin")
    assert events == []  # without compile: no cache read or written
