"""One reliability case and how the groups run the real `recsys` command."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECSYS = str(Path(sys.executable).with_name("recsys"))  # the console script of this environment
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Case:
    group: str  # api, inputs, crashes
    name: str
    input: str  # what was sent or run, in short
    expected: str  # the answer that counts as right, e.g. "422 naming k" or "exit 2 naming line 3"
    outcome: str  # what came back, e.g. "422" or "exit 2"
    clear: bool  # the expected answer, and its message names the problem
    server_error: bool  # a 500, or no answer at all
    traceback: bool  # a traceback in the output (or the server's log) where a message was due
    data_lost: bool  # something lost or half-written
    message: str  # the start of the message

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Finished:
    exit_code: int
    output: str  # stdout + stderr
    seconds: float


def run_recsys(*args: str, cwd: Path | None = None, timeout_s: float = 600) -> Finished:
    """`recsys ARGS` as a real process (stdout and stderr together)."""
    start = time.perf_counter()
    done = subprocess.run(
        [RECSYS, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )
    return Finished(done.returncode, done.stdout + done.stderr, time.perf_counter() - start)


def short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
