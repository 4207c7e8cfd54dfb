"""Run a command and write what `wait4` says of it as JSON: exit code, wall and CPU seconds, peak RSS.

Usage:
    .venv/bin/python -m benchmarks.child_rusage OUT.json COMMAND [ARG ...]

Why a process of its own (`benchmarks.scale` starts every step through it): Linux starts a process's ru_maxrss at the
resident size of the memory image it exec()s from, so a command started straight from a benchmark that imported
torch would report at least that benchmark's peak. Started from this small fresh interpreter, its floor is ~15 MB.
Standard library only, for the same reason. Exits with the command's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: python -m benchmarks.child_rusage OUT.json COMMAND [ARG ...]")
    out, command = Path(argv[0]), argv[1:]
    started = time.perf_counter()
    child = subprocess.Popen(command)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    figures = {
        "returncode": child.returncode,
        "wall_s": time.perf_counter() - started,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_kib": usage.ru_maxrss,  # KiB on Linux; the child's and those it waited for
    }
    out.write_text(json.dumps(figures))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
