"""The budget of a long step: wall seconds and resident memory, each optional, each set by a knob the error names.

A step checks its budget between batches (`BudgetGuard.check`). Running out is a `BudgetExceeded` that says what was
measured against what budget, how far the step got and which knob raises it: raised while the process can still say
so, instead of a kernel OOM kill or a run that outlives its slot. Memory is the process's resident set NOW (not its
peak), so a check between batches sees the step's growth before the kernel does; by default it is the whole
process's, as the kernel counts it (imports included: 0.09 GiB for `recsys data prepare`, more once torch is loaded).
A budget for what the step itself may use (`memory_from_start`) counts the growth since `start()` instead, so a step
run inside a long-lived process (a benchmark training many models, a test session) is not charged for what the
process held before it. GPU memory is not counted.

Example:
    >>> budget = Budget("demo", seconds=Limit(60.0, "--max-seconds"))
    >>> guard = budget.start()
    >>> guard.check("after 1 of 3 batches")  # well within a minute: nothing happens
"""

from __future__ import annotations

import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from recsys.errors import BudgetExceeded, ConfigError

GIB = 2**30
STATM = Path("/proc/self/statm")  # Linux: sizes in pages; the second field is the resident set


def resident_gib() -> float:
    """The process's resident memory now, in GiB. Where /proc is missing (macOS), its peak so far
    (`getrusage`): an upper bound on now, so a budget still trips, perhaps later than it could."""
    try:
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB
    except FileNotFoundError:  # only a missing /proc: any other failure (no file descriptor left) is the caller's
        return peak_resident_gib()


def peak_resident_gib() -> float:
    """The process's peak resident memory so far, in GiB (`getrusage`)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024) / GIB  # bytes on macOS, KiB elsewhere


@dataclass(frozen=True)
class Limit:
    """A bound on one resource and the knob that sets it.

    Args:
        value: the bound (> 0): seconds, or GiB.
        knob: what raises it, as the user writes it, e.g. "--max-seconds (eval.max_seconds in a config)".
        shrink: how to make the work smaller instead, e.g. "lower eval.batch_size"; "" when there is no such way.
    """

    value: float
    knob: str
    shrink: str = ""

    def __post_init__(self) -> None:
        if not self.value > 0:
            raise ConfigError(
                f"{self.knob} must be > 0, got {self.value}. Fix: give a positive number, or leave it out"
            )

    def fix(self) -> str:
        return f"raise {self.knob}" + (f", or {self.shrink}" if self.shrink else "")


def limit(value: float | None, knob: str, shrink: str = "") -> Limit | None:
    """A `Limit`, or None (no bound) when `value` is None: how an optional setting becomes a budget."""
    return None if value is None else Limit(value, knob, shrink)


@dataclass(frozen=True)
class Budget:
    """What a step may spend; a missing limit does not bound.

    Args:
        step: the step as the error names it, e.g. "evaluation" or "the prepare".
        seconds: wall-clock seconds from `start()`.
        memory_gb: the process's resident memory, GiB (with `memory_from_start`, its growth since `start()`).
        memory_from_start: bound the memory the step adds, not the whole process's.
    """

    step: str
    seconds: Limit | None = None
    memory_gb: Limit | None = None
    memory_from_start: bool = False

    def start(self) -> BudgetGuard:
        """The clock starts now: check the budget with the guard between the step's batches."""
        held = resident_gib() if self.memory_gb is not None and self.memory_from_start else 0.0
        return BudgetGuard(self, time.monotonic(), held)


@dataclass(frozen=True)
class BudgetGuard:
    """A started `Budget`.

    Args:
        budget: what the step may spend.
        started: `time.monotonic()` when the step started.
        held_at_start: the resident GiB not charged to the step (what the process held at its start, with
            `memory_from_start`; else 0).
    """

    budget: Budget
    started: float
    held_at_start: float = 0.0

    def check(self, progress: str) -> None:
        """Raise `BudgetExceeded` if the step has run past its seconds or holds more resident memory than its budget.
        Cheap (a clock read, and a read of /proc/self/statm only when memory is bounded): call it between batches.

        Args:
            progress: how far the step got, for the message, e.g. "after 3 of 40 user batches".
        """
        over = self._over()
        if over is not None:
            problem, bound = over
            raise BudgetExceeded(self.budget.step, f"{problem} ({progress})", bound.fix())

    def _over(self) -> tuple[str, Limit] | None:
        """What ran past its bound (the time first) and that bound, or None."""
        seconds, memory = self.budget.seconds, self.budget.memory_gb
        if seconds is not None:
            elapsed = time.monotonic() - self.started
            if elapsed > seconds.value:
                return f"ran {elapsed:,.1f} s, over its time budget of {seconds.value:g} s", seconds
        if memory is not None:
            resident = resident_gib()
            if resident - self.held_at_start > memory.value:
                over = f"over its budget of {memory.value:g} GiB"
                if not self.budget.memory_from_start:
                    return f"holds {resident:.2f} GiB of resident memory, {over}", memory
                grown = resident - self.held_at_start
                return f"added {grown:.2f} GiB of resident memory (the process holds {resident:.2f}), {over}", memory
        return None
