"""Progress lines: done of total with the ETA (and that of what follows), rows/s, at most one line per interval; a bar
on a terminal."""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import subprocess
import sys
import termios

import pytest

from recsys.runtime import progress as progress_module
from recsys.runtime.progress import Progress, Then, duration

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


def test_the_eta_of_what_follows_is_an_upper_bound_said_with_why(caplog: pytest.LogCaptureFixture) -> None:
    later = Then("training", 600.0, why="early stopping may end it sooner")
    with caplog.at_level(logging.INFO, logger="tests.progress"):
        progress = Progress(logger, "training epoch 2/5", total=40, unit="batches", rows_are="targets", every=0.0,
                            then=later)  # fmt: skip
        progress.update(done=40, rows=640)
        Progress(logger, "epoch 3/5", total=40, unit="batches", every=0.0, then=later).update(done=50, rows=1)
    counted, longer = caplog.messages
    assert counted.startswith("training epoch 2/5: 40 of 40 batches (100%), 640 targets, ")
    assert counted.endswith("ETA 0 s; training at most 10 min 0 s (early stopping may end it sooner)")
    assert longer.startswith("epoch 3/5: 50 of 50 batches (100%), ")  # an estimated total is raised to what was done


def test_durations_read_as_a_person_reads_an_eta() -> None:
    seconds = (0.4, 59.4, 59.6, 3_599, 7_260)
    assert [duration(s) for s in seconds] == ["0 s", "59 s", "1 min 0 s", "59 min 59 s", "2 h 1 min"]
    assert duration(float("nan")) == "unknown"


PROGRESS_WITH_A_BAR = """
import logging, time
from recsys.runtime.progress import Progress, Then
logging.basicConfig(level=logging.INFO, format="%(message)s")
progress = Progress(logging.getLogger("demo"), "training epoch 2/3", total=4, unit="batches", every=0.0, bar=True,
                    then=Then("training", 90.0))
for done in range(1, 5):
    time.sleep(0.15)  # tqdm redraws at most every 0.1 s
    progress.update(done=done, rows=10)
progress.finish()
"""


@pytest.mark.parametrize("terminal", [True, False])
def test_a_terminal_gets_a_bar_and_a_log_the_lines(terminal: bool) -> None:
    """A real child process whose stderr is a pseudo-terminal (as in a shell) or a pipe (a CI log)."""
    reader, writer = os.openpty() if terminal else os.pipe()
    if terminal:  # 24 rows of 120 columns: tqdm draws nothing on a terminal of no size
        fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    command = [sys.executable, "-c", PROGRESS_WITH_A_BAR]
    with subprocess.Popen(command, stderr=writer, stdin=subprocess.DEVNULL) as child:
        os.close(writer)
        output = b""
        while chunk := _read(reader):
            output += chunk
    os.close(reader)
    text = output.decode()
    assert child.returncode == 0, text
    assert "training epoch 2/3: done, 40 rows in " in text  # the closing line, either way
    if terminal:
        assert "4/4" in text and "100%|" in text and "training ≤ " in text, text  # tqdm's bar, the run's bound
        assert "training epoch 2/3: 1 of 4 batches" not in text
    else:
        assert "training epoch 2/3: 1 of 4 batches (25%), 10 rows, " in text and "%|" not in text


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # a pseudo-terminal's reader gets EIO once the child closed it
        return b""
