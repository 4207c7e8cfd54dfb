"""`recsys distill`: its errors before any work (the student's training is tests/pipelines/test_distill_step.py's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def test_missing_teacher_dir_exits_2_naming_the_key_and_the_fix(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = tiny_config(tmp_path)
    missing = tmp_path / "no-such-teacher"
    result = runner.invoke(app, ["distill", "--config", str(config), "--teacher-dir", str(missing)])
    assert result.exit_code == 2, result.output
    assert f"distill.teacher_dir: {missing} is not a model directory" in result.output
    assert "Fix: train that model first" in result.output
    assert not (tmp_path / "runs").exists(), "nothing was prepared for a student without a teacher"


def test_no_teacher_at_all_exits_2_saying_how_to_give_one(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    result = runner.invoke(app, ["distill", "--config", str(tiny_config(tmp_path))])
    assert result.exit_code == 2
    assert "no distill section" in result.output and "Fix: pass --teacher-dir DIR" in result.output
