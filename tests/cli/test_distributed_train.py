"""`recsys train --nproc-per-node 2`: the real elastic launcher, two gloo processes, one model written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # pytest holds stderr: nothing to report
def test_two_processes_train_one_model_and_a_rerun_on_one_finds_it_current(
    tmp_path: Path, tiny_config: Callable[..., Path], capfd: pytest.CaptureFixture[str]
) -> None:
    config = str(tiny_config(tmp_path, train={"schedule": {"epochs": 2}, "hardware": {"threads": 1}}))
    two = runner.invoke(app, ["train", "--config", config, "--work-dir", str(tmp_path), "--nproc-per-node", "2"])
    printed, logged = capfd.readouterr()  # the processes write to the terminal, not to the runner

    assert two.exit_code == 0, two.output + logged
    assert two.output.count("N@10") == 1 and "N@10" not in printed  # the launching command reports, once
    assert "distributed: 2 processes, backend gloo" in logged
    metrics = json.loads((tmp_path / "models" / "tiny-sasrec" / "metrics.json").read_text())
    assert metrics["best_epoch"] >= 1 and 0 < metrics["test"]["ndcg@10"] <= 1
    # the number of processes spreads the run, it does not change what it learns: one process finds it up to date
    one = runner.invoke(app, ["train", "--config", config, "--work-dir", str(tmp_path)])
    assert one.exit_code == 0, one.output
    assert "step train_retriever: up to date, skipped" in one.output


def test_pipeline_run_trains_on_two_processes_and_runs_the_other_steps_once(
    tmp_path: Path, tiny_config: Callable[..., Path], capfd: pytest.CaptureFixture[str]
) -> None:
    config = str(
        tiny_config(
            tmp_path,
            train={"schedule": {"epochs": 2}, "hardware": {"threads": 1}},
            pipeline={"index": {"kind": "flat"}},
        )
    )
    result = runner.invoke(
        app, ["pipeline", "run", "--config", config, "--work-dir", str(tmp_path), "--nproc-per-node", "2"]
    )
    printed, logged = capfd.readouterr()

    assert result.exit_code == 0, result.output + logged
    assert "[rank 0] pipelines.runner: step train_retriever: running" in logged  # trained by the processes
    assert "[rank 1]" not in logged  # the second process's progress stays quiet: it does the first's work
    assert "step register: running" in result.output  # the rest, once, by the launching command
    assert result.output.count("│ train_retriever") == 1 and "│ train_retriever" not in printed  # one table
