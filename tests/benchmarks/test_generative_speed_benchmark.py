"""The generative speed benchmark end to end on its smoke config (CPU): the trainer's epoch and validation times and
time to the first step, a profile of the steps after the first ones, a result that reproduces from its config and
keeps what it measured when a later phase stops it, and the warm start's process of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.generative_speed as generative_speed
from benchmarks.reproduce import problems_of
from recsys.errors import ConfigError

SMOKE = "benchmarks/configs/generative-speed-smoke.yaml"


def test_the_smoke_run_times_epochs_and_profiles_training_steps(tmp_path: Path) -> None:
    argv = ["--config", SMOKE, "--results-dir", str(tmp_path), "--set", f"work_dir={tmp_path / 'work'}"]
    path = generative_speed.main(argv)
    assert path == tmp_path / "generative-speed-smoke.json" and problems_of(path) == []
    result = json.loads(path.read_text())
    eager = result["variants"]["eager"]
    assert eager["epochs"] == 3 and eager["seconds_per_epoch"] > 0 and eager["valid_seconds_per_epoch"] > 0
    assert result["fastest"] == "eager" and result["seconds_per_epoch"] == eager["seconds_per_epoch"]
    assert 0 < eager["time_to_first_step_s"] < eager["time_to_first_validation_s"]
    assert result["time_to_first_step_s"] == eager["time_to_first_step_s"]
    assert result["warm_start"] is None  # no compiled variant: nothing to start warm
    beams = result["beam_precision"]  # the trained model ranking validation with fp32 and with bf16 beams
    assert set(beams) == {"fp32", "bf16"} and all(beams[p]["seconds"] > 0 for p in beams)
    assert all(beams[p]["first_pass_seconds"] > 0 for p in beams)  # the timed pass is the second
    assert beams["fp32"]["ndcg@10"] == pytest.approx(eager["valid"]["ndcg@10"])  # the run's own validation
    assert beams["bf16"]["ndcg@10"] == pytest.approx(beams["fp32"]["ndcg@10"], abs=0.05)
    assert result["experiment"] == "configs/synthetic/generative.yaml" and result["gpu"] is None
    profile = result["profile"]
    assert profile["variant"] == "eager" and profile["steps"] == 3 and profile["ms_per_step"] > 0
    assert profile["device_busy_share"] == 0  # the CPU run has no device kernels
    names = [row["name"] for row in profile["top_host_ops"]]
    assert len(names) == 5 and not any(name.startswith("ProfilerStep") for name in names)
    with pytest.raises(ConfigError, match=r"variants\.0"):  # a name that is neither eager nor a compile mode
        generative_speed.main([*argv, "--set", "variants=[fast]"])
    assert "unfinished" not in result
    with pytest.raises(SystemExit, match="fewer than profile_after"):
        generative_speed.main([*argv, "--set", "profile_after=1000", "--set", "epochs=1"])
    # stopped in its last phase: the JSON keeps the timed run and the beam precisions, and says what did not run
    partial = json.loads(path.read_text())
    assert partial["unfinished"] == ["profile"] and partial["profile"] is None
    assert partial["variants"]["eager"]["epochs"] == 1 and set(partial["beam_precision"]) == {"fp32", "bf16"}


def test_the_warm_start_trains_one_epoch_in_a_process_of_its_own(tmp_path: Path) -> None:
    argv = ["--config", SMOKE, "--set", f"work_dir={tmp_path / 'work'}"]
    _, reproduce, _ = generative_speed.parse_run(
        generative_speed.benchmark_parser(generative_speed.__doc__), argv, generative_speed.__name__,
        generative_speed.load_settings,
    )  # fmt: skip
    warm = generative_speed.warm_start(reproduce, "eager")  # the command line a compiled variant's would be
    assert warm["variant"] == "eager" and warm["epochs"] == 1 and warm["time_to_first_step_s"] > 0
    assert warm["inductor_cache"] == {}  # eager: nothing compiled, no cache looked up
