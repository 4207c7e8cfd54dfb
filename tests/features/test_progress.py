"""Progress lines: done of total with the ETA, rows/s, at most one line per interval."""

from __future__ import annotations

import logging

import pytest

from features.progress import Progress

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
