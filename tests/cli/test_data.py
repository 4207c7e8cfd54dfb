"""`recsys data prepare|validate` through typer's CliRunner on the sub-app."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cli.data import app
from recsys.data import schema
from recsys.runtime import budget

runner = CliRunner()


def test_prepare_writes_the_directory(p5_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["prepare", "--source", "amazon-p5", "--input", str(p5_dir), "--out", str(out)]
    result = runner.invoke(app, [*args, "--cold-start-fraction", "0.2", "--unknown-items", "keep"])
    assert result.exit_code == 0, result.output
    assert (out / schema.META_FILE).exists()
    assert "wrote" in result.stdout


def test_prepare_joins_the_attribute_files_named_under_the_input(p5_dir: Path, tmp_path: Path) -> None:
    (p5_dir / "item_categories.csv").write_text("item_id,categories\na,Toys > Cars\nb,Toys > Dolls\n")
    (p5_dir / "item_names.csv").write_text("item_id,name\nc,charlie car\n")
    out = tmp_path / "out"
    args = ["prepare", "--source", "amazon-p5", "--input", str(p5_dir), "--out", str(out), "--unknown-items", "keep"]
    result = runner.invoke(app, [*args, "--categories", "item_categories.csv", "--names", "item_names.csv"])
    assert result.exit_code == 0, result.output
    items = pl.read_parquet(out / schema.ITEMS_FILE).sort("item_id")
    paths = dict(zip(items["item_id"], items["category_path"].to_list(), strict=True))
    assert paths["a"] == ["Toys", "Cars"] and paths["c"] is None  # items without a path: null
    assert dict(zip(items["item_id"], items["name"], strict=True))["c"] == "charlie car"
    missing = runner.invoke(app, [*args, "--categories", "no_such.csv"])
    assert missing.exit_code == 2 and "no_such.csv" in missing.output  # named, with the fix, before anything is written


def test_validate_writes_nothing_and_reports(p5_dir: Path, tmp_path: Path) -> None:
    before = sorted(tmp_path.rglob("*"))
    result = runner.invoke(app, ["validate", "--source", "amazon-p5", "--input", str(p5_dir)])
    assert result.exit_code == 0, result.output
    assert sorted(tmp_path.rglob("*")) == before
    for word in ("interactions", "min_interactions", "unknown_items", "nothing written"):
        assert word in result.stdout


def test_data_error_exits_2_with_message_on_stderr(write: Callable[..., Path]) -> None:
    path = write("ratings.dat", "1::10::4::978300760\n1::20::5\n")
    result = runner.invoke(app, ["validate", "--source", "movielens", "--input", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {path}, line 2: expected 4 fields")
    assert result.stdout == ""


def test_unknown_source_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["prepare", "--source", "imdb", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "valid sources: amazon-p5, amazon-p5-domains, amazon-raw, movielens, synthetic" in result.stderr
    assert not (tmp_path / "o").exists()


def test_bad_policy_value_is_a_usage_error(p5_dir: Path) -> None:
    result = runner.invoke(app, ["validate", "--source", "amazon-p5", "--input", str(p5_dir), "--unknown-items", "x"])
    assert result.exit_code == 2


@pytest.mark.skipif(importlib.util.find_spec("features.synthetic") is None, reason="features/synthetic.py missing")
def test_prepare_synthetic(tmp_path: Path) -> None:
    out = tmp_path / "syn"
    args = ["prepare", "--source", "synthetic", "--num-users", "40", "--num-items", "72", "--seed", "2"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = (out / schema.META_FILE).read_text()
    assert '"num_users": 40' in meta and '"seed": 2' in meta


def test_memory_budget_is_an_option_and_is_checked(p5_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["prepare", "--source", "amazon-p5", "--input", str(p5_dir), "--out", str(out)]
    assert runner.invoke(app, [*args, "--memory-budget-gb", "8"]).exit_code == 0
    result = runner.invoke(app, [*args, "--memory-budget-gb", "0"])
    assert result.exit_code == 2
    assert "memory_budget_gb: Input should be greater than 0. Fix:" in result.stderr


def test_running_out_of_a_budget_exits_2_naming_the_knob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["prepare", "--source", "synthetic", "--num-users", "40", "--num-items", "72", "--out", str(tmp_path / "o")]
    held = budget.resident_gib()
    readings = iter([held])  # the prepare starts holding `held`; every later reading 1 GiB more (simulated growth)
    monkeypatch.setattr(budget, "resident_gib", lambda: next(readings, held + 1.0))
    memory = runner.invoke(app, [*args, "--memory-budget-gb", "0.5"])
    monkeypatch.undo()
    assert memory.exit_code == 2
    assert "error: the prepare: added 1.00 GiB" in memory.stderr  # after any log lines other tests route to stderr
    assert "Fix: raise --memory-budget-gb" in memory.stderr
    time = runner.invoke(app, ["validate", "--source", "synthetic", "--num-users", "40", "--max-seconds", "1e-9"])
    assert time.exit_code == 2
    assert "over its time budget of 1e-09 s" in time.stderr and "Fix: raise --max-seconds" in time.stderr
    assert not (tmp_path / "o").exists()
