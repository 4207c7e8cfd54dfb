"""Progress lines: done of total with the ETA, rows/s, at most one line per interval."""

from __future__ import annotations

import logging

import pytest

from recsys.runtime import progress as progress_module
from recsys.runtime.progress import Progress

logger = logging.getLogger("tests.progress")


def test_progress_logs_share_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tests.progress"):
        progress = Progress(logger, "reading x", total=200.0, unit="MB", rows_are="lines", every=0.0)
        progress.update(done=50.0, rows=1_000)
        progress.finish()
    first, last = caplog.messages
    assert first.startswith("reading x: 50 of 200 MB (25%), 1,000 lines, ")
    assert "lines/s, ETA" in first
    assert last.startswith("reading x: done, 1,000 lines in ")


def test_progress_without_a_total_and_between_intervals(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tests.progress"):
        quiet = Progress(logger, "policies", total=None, unit="parts")
        quiet.update(done=1, rows=10)  # within the first interval: no line
        counting = Progress(logger, "policies", total=None, unit="parts", every=0.0)
        counting.update(done=3, rows=30)
    assert caplog.messages == [caplog.messages[0]]
    assert caplog.messages[0].startswith("policies: 3 parts, 30 rows, ")
    assert quiet.rows == 10


def test_rows_that_are_the_unit_are_counted_once_and_the_interval_is_read_when_made(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module, "EVERY_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="tests.progress"):
        progress = Progress(logger, "evaluation", total=10, unit="users", rows_are="users")
        progress.update(done=4, rows=4)
    (line,) = caplog.messages
    assert line.startswith("evaluation: 4 of 10 users (40%), ")
    assert line.count("users") == 2 and "users/s, ETA " in line  # "4 of 10 users", "N users/s": no "4 users" again
