"""Runs side by side: real processes, N at a time, each with its log and its share of the cores; a failure is named
with the end of its log once the others have ended; a SIGTERM stops the processes it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.side_by_side import Unit, run_side_by_side

# each unit: marks itself running, notes how many are, reports its thread share, ends (or fails)
UNIT = """
import os, sys, time
from pathlib import Path
here = Path(sys.argv[1])
(here / f"running-{sys.argv[2]}").touch()
print("running at once:", len(list(here.glob("running-*"))), "polars threads:", os.environ.get("POLARS_MAX_THREADS"))
time.sleep(0.5)
(here / f"running-{sys.argv[2]}").unlink()
if sys.argv[2] == "bad":
    sys.exit("the input was bad")
"""


def test_every_unit_runs_n_at_a_time_and_a_failure_is_named_with_its_log(tmp_path: Path) -> None:
    script = tmp_path / "unit.py"
    script.write_text(UNIT)
    names = ["a", "bad", "c", "d"]
    units = [Unit(f"unit {n}", [sys.executable, str(script), str(tmp_path), n], tmp_path / "logs" / f"{n}.log")
             for n in names]  # fmt: skip
    with pytest.raises(SystemExit, match=r"1 of 4 runs failed:\n- unit bad: exit code 1, log \S*bad\.log; it ends:\n"
                                         r"    running at once: .*\n    the input was bad$"):  # fmt: skip
        run_side_by_side(units, processes=2, poll_s=0.05)
    share = os.environ.get("POLARS_MAX_THREADS", str(max(1, (os.cpu_count() or 1) // 2)))
    for name in names:  # every unit ran, the failed one did not stop the others
        started, first = (tmp_path / "logs" / f"{name}.log").read_text().splitlines()[:2]
        assert started.startswith(f"==== unit {name}, started 20"), started
        at_once = int(first.split()[3])
        assert 1 <= at_once <= 2 and first.endswith(f"polars threads: {share}"), first
    assert not list(tmp_path.glob("running-*"))


def test_a_rerun_appends_to_the_log_of_the_attempt_before(tmp_path: Path) -> None:
    attempt = (
        "import pathlib, sys; n = pathlib.Path(sys.argv[1]); n.write_text(n.read_text() + 'x'); print(n.read_text())"
    )
    counter = tmp_path / "attempts"
    counter.write_text("")
    unit = Unit("resumed", [sys.executable, "-c", attempt, str(counter)], tmp_path / "resumed.log")
    for _ in range(2):
        run_side_by_side([unit], processes=1, poll_s=0.05)
    lines = unit.log.read_text().splitlines()
    assert [line.startswith("==== resumed, started ") for line in lines] == [True, False, True, False], lines
    assert lines[1::2] == ["x", "xx"], "the first attempt's output was lost"


def test_each_process_runs_on_the_gpu_running_the_fewest(tmp_path: Path) -> None:
    seen = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(0.5)"
    units = [Unit(f"unit {n}", [sys.executable, "-c", seen], tmp_path / f"{n}.log") for n in "abcd"]
    run_side_by_side(units, processes=3, gpus=["3", "5"], poll_s=0.05)
    gpus = [(tmp_path / f"{n}.log").read_text().splitlines()[-1] for n in "abcd"]
    assert gpus[:3] == ["3", "5", "3"] and gpus[3] in ("3", "5")  # the fourth: on the GPU the first to end freed


def test_one_groups_units_are_spread_over_the_gpus(tmp_path: Path) -> None:
    """Two models' seeds in the order comparisons gives them (seed by seed): by process count alone each model would
    land on one GPU, its seeds' costs (a slow model's and a fast one's) all on one."""
    seen = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(0.5)"
    units = [Unit(f"{model} seed {seed}", [sys.executable, "-c", seen], tmp_path / f"{model}{seed}.log", group=model)
             for seed in range(2) for model in ("fast", "slow")]  # fmt: skip
    run_side_by_side(units, processes=4, gpus=["3", "5"], poll_s=0.05)
    gpu = {unit.group + unit.name[-1]: unit.log.read_text().splitlines()[-1] for unit in units}
    assert {gpu["fast0"], gpu["fast1"]} == {gpu["slow0"], gpu["slow1"]} == {"3", "5"}, gpu


def test_no_processes_is_refused() -> None:
    with pytest.raises(SystemExit, match=r"--side-by-side 0: give 1 or more processes"):
        run_side_by_side([], processes=0)


RUNNER = """
import sys
from pathlib import Path
from benchmarks.side_by_side import Unit, run_side_by_side
here = Path(sys.argv[1])
unit = Unit("sleeper", [sys.executable, "-c", sys.argv[2], str(here)], here / "sleeper.log")
run_side_by_side([unit], 1, poll_s=0.05)
"""


# a run that takes a second to stop once asked (as a trainer finishing its checkpoint), saying when it was asked
SLEEPER = """
import os, signal, sys, time
from pathlib import Path
here = Path(sys.argv[1])
def stop(signum, frame):
    (here / "asked").write_text("asked")
    time.sleep(1)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
(here / "pid").write_text(str(os.getpid()))
time.sleep(120)
"""


def _wait_for(path: Path, runner: subprocess.Popen[str]) -> None:
    """Until `path` holds something, the runner running all the while."""
    deadline = time.monotonic() + 60
    while not (path.exists() and path.read_text()):
        assert runner.poll() is None and time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)


# `timeout` signals its command and then the command's whole process group: the runner gets SIGTERM twice, the second
# while it waits for its processes to stop
@pytest.mark.parametrize("signals", [1, 2])
def test_a_sigterm_stops_the_processes_it_started(tmp_path: Path, signals: int) -> None:
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), SLEEPER], stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})  # fmt: skip
    _wait_for(tmp_path / "pid", runner)
    sleeper = int((tmp_path / "pid").read_text())
    runner.send_signal(signal.SIGTERM)
    if signals == 2:
        _wait_for(tmp_path / "asked", runner)
        runner.send_signal(signal.SIGTERM)
    _, stderr = runner.communicate(timeout=60)
    assert runner.returncode == 1 and f"stopped sleeper (pid {sleeper})" in stderr, stderr
    assert "stopped (signal 15) with 1 runs going and 0 not started: the same command resumes" in stderr
    assert ("signal 15 again: already stopping" in stderr) == (signals == 2), stderr
    assert "Traceback" not in stderr and (tmp_path / "asked").exists()
    with pytest.raises(ProcessLookupError):  # reaped by the runner: gone, not a zombie
        os.kill(sleeper, 0)
