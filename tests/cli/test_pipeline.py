"""`recsys pipeline run`: its overrides (--set, --epochs), where it stops (--until) and what it re-runs (--rerun)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def test_until_set_and_rerun(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = str(tiny_config(tmp_path, tracking={"enabled": False}))
    work = str(tmp_path / "work")
    base = ["pipeline", "run", "--config", config, "--work-dir", work, "--until", "prepare_data"]

    first = runner.invoke(app, [*base, "--set", "data.options.num_users=40"])
    assert first.exit_code == 0, first.output
    assert "prepare_data" in first.output and "train_retriever" not in first.output  # stopped after it
    meta = json.loads((tmp_path / "work" / "data" / "tiny-sasrec" / "meta.json").read_text())
    assert meta["source_options"]["num_users"] == 40  # the override reached the step

    again = runner.invoke(app, [*base, "--set", "data.options.num_users=40"])
    rerun = runner.invoke(app, [*base, "--set", "data.options.num_users=40", "--rerun", "prepare_data"])
    assert "skipped" in again.output and "ran" not in again.output
    assert rerun.exit_code == 0 and " ran " in rerun.output


def test_bad_options_exit_2_with_the_fix(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = str(tiny_config(tmp_path, tracking={"enabled": False}))
    command = ["pipeline", "run", "--config", config, "--work-dir", str(tmp_path)]

    no_value = runner.invoke(app, [*command, "--set", "train.optimization.lr"])
    assert no_value.exit_code == 2 and "expected KEY=VALUE" in no_value.output
    unknown_key = runner.invoke(app, [*command, "--set", "train.learning_rate=0.1"])
    assert unknown_key.exit_code == 2 and "train.learning_rate" in unknown_key.output
    both = runner.invoke(app, [*command, "--step", "prepare_data", "--until", "evaluate"])
    assert both.exit_code == 2 and "not both" in both.output
    unknown_step = runner.invoke(app, [*command, "--rerun", "deploy"])
    assert unknown_step.exit_code == 2 and "unknown pipeline step 'deploy'" in unknown_step.output
