"""The prepare's budgets: the memory budget is checked against the resident memory the prepare adds, the time budget
against the clock, between batches (the synthetic generator's chunks included) and parts; running out names the knob."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from features.loaders import open_amazon_p5
from features.prepare import dry_run, prepare
from features.raw import RawStream
from features.settings import PrepareSettings
from features.sources import open_source
from recsys.errors import BudgetExceeded, ConfigError
from recsys.runtime import budget, progress
from recsys.runtime.budget import resident_gib


def test_the_memory_budget_counts_what_the_prepare_adds_and_past_it_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def raw() -> RawStream:
        return open_source("synthetic", None, num_users=300, num_items=100)

    assert resident_gib() > 0.1  # the test process holds more than the budget below before the prepare starts
    prepare(raw(), tmp_path / "within", PrepareSettings(memory_budget_gb=0.1))  # a 300-user prepare adds far less
    assert (tmp_path / "within" / "interactions.parquet").exists()

    held = resident_gib()  # the process's memory as the prepare starts; from then on, 1 GiB more (simulated growth)
    readings = iter([held])
    monkeypatch.setattr(budget, "resident_gib", lambda: next(readings, held + 1.0))
    out = tmp_path / "out"
    with pytest.raises(BudgetExceeded) as caught:
        prepare(raw(), out, PrepareSettings(memory_budget_gb=0.5))
    message = str(caught.value)
    assert message.startswith("the prepare: added 1.00 GiB of resident memory (the process holds ")
    assert "over its budget of 0.5 GiB (reading the input, after 1 batch(es) of about" in message
    assert message.endswith("Fix: raise --memory-budget-gb (data.memory_budget_gb in a config)")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name != "within"]  # nor a temporary directory


def test_a_time_budget_stops_the_prepare_and_the_dry_run(p5_dir: Path, tmp_path: Path) -> None:
    for run in (lambda: prepare(open_amazon_p5(p5_dir), tmp_path / "out", PrepareSettings(max_seconds=1e-9)),
                lambda: dry_run(open_amazon_p5(p5_dir), PrepareSettings(max_seconds=1e-9))):  # fmt: skip
        with pytest.raises(BudgetExceeded, match=r"^the prepare: ran .* over its time budget of 1e-09 s \(reading"):
            run()
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="max_seconds: Input should be greater than 0"):
        PrepareSettings.checked(max_seconds=0.0)


def test_within_its_budgets_the_prepare_logs_its_progress(
    p5_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)  # a line per part, not one every few seconds
    with caplog.at_level(logging.INFO, logger="features"):
        summary = prepare(open_amazon_p5(p5_dir), tmp_path / "out", PrepareSettings(partitions=2, max_seconds=600.0))
    assert summary.num_interactions == 11
    lines = [line for line in caplog.messages if line.startswith("applying the policies: ")]
    assert lines[0].startswith("applying the policies: 1 of 2 parts (50%), ")
    assert "interactions/s, ETA " in lines[0]
