"""A benchmark's independent runs as processes of their own, several at a time: what `--only-seed I` typed in several
shells does, from one command. Each process gets its share of the cores (`pipelines.launcher.cores_shared`: N
processes each spinning one thread per core would slow each other down many times over), on a host of several GPUs
the one running the fewest of them, of those the fewest of its group (`CUDA_VISIBLE_DEVICES`; a group: one model's
seeds, which cost alike, spread over the GPUs rather than all on one), and appends its output to a log file of its
own (a resumed run's log keeps its earlier attempts, each opened by a line saying when it started); a line says when
each starts and ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from pipelines.launcher import cores_shared

STOP_GRACE_S = 30.0  # what a stopped process gets to exit before it is killed
LOG_TAIL_LINES = 5  # of a failed process's log, shown in the error


@dataclass(frozen=True)
class Unit:
    """One process to run: its name in the progress lines, its command, its log file, and its group: units of one
    group (one model's seeds) cost alike, so they are spread over the GPUs."""

    name: str
    command: list[str]
    log: Path
    group: str = ""


@dataclass
class _Running:
    unit: Unit
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float
    gpu: str | None
    log_from: int  # where this attempt's output begins in the log


def run_side_by_side(units: Sequence[Unit], processes: int, gpus: Sequence[str] = (), poll_s: float = 0.5) -> None:
    """Run every unit, `processes` at a time, in the order given, each on the GPU of `gpus` (CUDA device ids) that
    runs the fewest, of those the fewest of its group (one or none given: the processes see what this one sees); once
    all have ended, SystemExit naming each one that failed with its exit code and the end of its log. A SIGTERM or
    Ctrl-C stops the running ones and exits (the benchmarks' runs resume where they stopped)."""
    if processes < 1:
        raise SystemExit(f"--side-by-side {processes}: give 1 or more processes")
    gpus = gpus if len(gpus) > 1 else ()
    pending, running, failed = list(units), list[_Running](), list[str]()  # failed: each one's description
    with cores_shared(min(processes, len(units)) or 1), _stopped_on_sigterm():
        try:
            while pending or running:
                while pending and len(running) < processes:
                    unit = pending.pop(0)
                    running.append(_start(unit, _least_loaded(gpus, unit, running) if gpus else None))
                time.sleep(poll_s)
                for run in [run for run in running if run.process.poll() is not None]:
                    running.remove(run)
                    run.log.close()
                    failed += _report(run, finished=len(units) - len(pending) - len(running), of=len(units))
        except KeyboardInterrupt as stop:
            raise SystemExit(f"stopped ({stop or 'Ctrl-C'}) with {len(running)} runs going and {len(pending)} not "
                             "started: the same command resumes them") from None  # fmt: skip
        finally:
            _stop(running)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(units)} runs failed:\n" + "\n".join(failed))


def _least_loaded(gpus: Sequence[str], unit: Unit, running: Sequence[_Running]) -> str:
    """The GPU running the fewest processes, of those the fewest of `unit`'s group; the first such in `gpus`."""
    on = {gpu: [run for run in running if run.gpu == gpu] for gpu in gpus}
    return min(gpus, key=lambda gpu: (len(on[gpu]), sum(run.unit.group == unit.group for run in on[gpu])))


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as `CUDA_VISIBLE_DEVICES` entries: its own list when set, else every
    device's index."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [entry.strip() for entry in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if entry.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]


def _start(unit: Unit, gpu: str | None) -> _Running:
    unit.log.parent.mkdir(parents=True, exist_ok=True)
    where = "" if gpu is None else f" on GPU {gpu}"
    log = unit.log.open("ab")  # after the attempts before (a stopped run resumes): what led up to a stop is kept
    log.write(f"==== {unit.name}{where}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')} ====\n".encode())
    log.flush()
    env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    process = subprocess.Popen(unit.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    print(f"started {unit.name}{where} (pid {process.pid}, log {unit.log})", flush=True)
    return _Running(unit, process, log, time.monotonic(), gpu, log_from=log.tell())


def _report(run: _Running, finished: int, of: int) -> list[str]:
    """Print the end of one run; the failure's description (a list of one) if it failed."""
    seconds, code = time.monotonic() - run.started, run.process.returncode
    print(f"[{finished}/{of}] {run.unit.name} {'done' if code == 0 else f'FAILED (exit code {code})'} "
          f"after {seconds:.0f} s", flush=True)  # fmt: skip
    if code == 0:
        return []
    output = run.unit.log.read_bytes()[run.log_from :].decode(errors="replace")  # this attempt's
    tail = "\n".join(f"    {line}" for line in output.splitlines()[-LOG_TAIL_LINES:])
    return [f"- {run.unit.name}: exit code {code}, log {run.unit.log}; it ends:\n{tail}"]


def _stop(running: list[_Running]) -> None:
    """Stop the running processes: all asked at once, each given up to `STOP_GRACE_S` in all, then killed."""
    for run in running:
        run.process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for run in running:
        try:
            run.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            run.process.kill()
            run.process.wait()
        run.log.close()
        print(f"stopped {run.unit.name} (pid {run.process.pid})", file=sys.stderr, flush=True)


@contextmanager
def _stopped_on_sigterm() -> Iterator[None]:
    """A SIGTERM (a scheduler's or `timeout`'s) ends this process as Ctrl-C does, through the cleanup that stops the
    processes it started, instead of leaving them running. Later ones only say so: `timeout` signals its command and
    then the command's process group, and a second interrupt would cut the cleanup short."""

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, already_stopping)
        raise KeyboardInterrupt(f"signal {signum}")

    def already_stopping(signum: int, frame: Any) -> None:
        print(f"signal {signum} again: already stopping the runs", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
