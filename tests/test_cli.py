"""The `recsys` command line, end to end on the tiny synthetic data (real MLflow SQLite store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recsys.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> Path:
    work = tmp_path_factory.mktemp("cli")
    result = runner.invoke(app, ["train", "--config", str(tiny_config(work)), "--work-dir", str(work)])
    assert result.exit_code == 0, result.output
    assert "N@10" in result.output
    return work / "models" / "tiny-sasrec"


def test_evaluate_prints_the_metrics_table(trained_dir: Path) -> None:
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--split", "valid"])
    assert result.exit_code == 0, result.output
    assert "R@10" in result.output


def test_recommend_shows_titles_for_a_known_user(trained_dir: Path) -> None:
    result = runner.invoke(app, ["recommend", "--model-dir", str(trained_dir), "--user", "u00001", "--k", "5"])
    assert result.exit_code == 0, result.output
    assert "recommended next" in result.output
    assert result.output.count("\n") > 8


def test_unknown_user_and_bad_split_exit_2_with_a_fix(trained_dir: Path) -> None:
    result = runner.invoke(app, ["recommend", "--model-dir", str(trained_dir), "--user", "nobody"])
    assert result.exit_code == 2
    assert "unknown user 'nobody'" in result.output and "Fix:" in result.output
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--split", "train"])
    assert result.exit_code == 2 and "--split valid or --split test" in result.output


def test_missing_model_dir_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["evaluate", "--model-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not a model directory" in result.output


def test_demo_runs_end_to_end(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = tiny_config(tmp_path, train={"epochs": 2})
    result = runner.invoke(app, ["demo", "--out", str(tmp_path / "demo"), "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "popularity" in result.output and "sasrec" in result.output
    assert result.output.count("recommended next") == 3
