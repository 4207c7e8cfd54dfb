"""Progress of a long step in the log: how far, how fast (rows/s) and, where the total is known, the ETA.

A prepare of 10^8 interactions or an evaluation of 10^6 users runs for minutes; one line every few seconds says it is
alive and when it will end, without flooding the log of a small run (which finishes before the first line is due).
A step that is one of several (an epoch of a run) may say what follows it (`Then`): its line then gives the ETA of
the whole as well, as an upper bound. Where stderr is a terminal a step may draw a tqdm bar instead of those lines
(`bar=True`); a log reader (a pipeline's, a service's, CI's) sees the lines.

Example:
    >>> progress = Progress(logging.getLogger("demo"), "reading", total=100.0, unit="MB")
    >>> progress.update(done=50.0, rows=1_000)
    >>> progress.rows
    1000
    >>> duration(4_000)
    '1 h 6 min'
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

EVERY_SECONDS = 5.0  # read when a `Progress` is made, so a test may shorten it


@dataclass(frozen=True)
class Then:
    """The work known to follow a step, at most `seconds` of it: the ETA of the whole (`what`, e.g. "training") is the
    step's ETA plus these, said as "at most", with `why` it may end sooner (in the log line; a bar has no room)."""

    what: str
    seconds: float
    why: str = ""  # e.g. "early stopping may end it sooner"


class Progress:
    """Logs `what` at INFO: done of total (with the ETA) or done alone, and rows/s, at most once per `every` seconds.

    Args:
        logger: the logger of the module doing the work.
        what: what is under way, e.g. "reading user_sequence.txt".
        total: the amount of work in `unit`s (bytes, parts), or None when it is not known in advance; an estimate
            (e.g. the previous epoch's batches) is raised to `done` when the work runs past it.
        unit: the unit of `done` and `total`, e.g. "MB" or "parts".
        rows_are: what a row is, e.g. "lines"; when it is `unit` (users done, users counted), the count is said once.
        every: seconds between two lines; None: `EVERY_SECONDS`.
        bar: where stderr is a terminal, draw a tqdm bar of the same (and of `then`) instead of the lines; the line
            of `finish` is logged either way.
        then: the work that follows this step, for the ETA of the whole (with a `total` only).
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        total: float | None,
        unit: str,
        rows_are: str = "rows",
        every: float | None = None,
        bar: bool = False,
        then: Then | None = None,
    ):
        self.logger = logger
        self.what = what
        self.total = total
        self.unit = unit
        self.rows_are = rows_are
        self.every = EVERY_SECONDS if every is None else every
        self.then = then
        self.done, self.rows = 0.0, 0
        self._start = time.monotonic()
        self._last_log = self._start
        self._bar = _terminal_bar(what, total, unit) if bar and sys.stderr.isatty() else None

    def update(self, *, done: float, rows: int) -> None:
        """Record that `done` units of work are done (a running total) and `rows` more rows were handled."""
        self.done = done
        self.rows += rows
        if self.total and done > self.total:
            self.total = done
        if self._bar is not None:
            self._draw(done)
            return
        now = time.monotonic()
        if now - self._last_log < self.every:
            return
        self._last_log = now
        elapsed = max(now - self._start, 1e-9)
        rate = f"{_rate(self.rows / elapsed)} {self.rows_are}/s"
        counted = rate if self.rows_are == self.unit else f"{self.rows:,} {self.rows_are}, {rate}"
        if self.total:
            share = f"{done:,.0f} of {self.total:,.0f} {self.unit} ({done / self.total:.0%})"
            self.logger.info("%s: %s, %s, ETA %s%s", self.what, share, counted, *self._etas(done, elapsed))
        else:
            self.logger.info("%s: %s %s, %s", self.what, f"{done:,.0f}", self.unit, counted)

    def finish(self) -> None:
        """Log the totals: rows, seconds and rows/s (and take the bar down)."""
        if self._bar is not None:
            self._bar.close()
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = f"{_rate(self.rows / elapsed)} {self.rows_are}/s"
        self.logger.info("%s: done, %s %s in %.1f s (%s)", self.what, f"{self.rows:,}", self.rows_are, elapsed, rate)

    def _etas(self, done: float, elapsed: float) -> tuple[str, str]:
        """The step's ETA, and "; `then.what` at most ... (`then.why`)" (or "" without `then`)."""
        left = self._left(done, elapsed)
        if self.then is None:
            return duration(left), ""
        why = f" ({self.then.why})" if self.then.why else ""
        return duration(left), f"; {self.then.what} at most {duration(left + self.then.seconds)}{why}"

    def _left(self, done: float, elapsed: float) -> float:
        """Seconds until `total`, at the pace so far (NaN before anything is done)."""
        assert self.total
        return elapsed * (self.total - done) / done if done else math.nan

    def _draw(self, done: float) -> None:
        assert self._bar is not None
        self._bar.total = self.total
        self._bar.update(done - self._bar.n)  # tqdm redraws at most 10 times a second
        if self.total and self.then is not None:
            left = self._left(done, max(time.monotonic() - self._start, 1e-9))
            self._bar.set_postfix_str(f"{self.then.what} ≤ {duration(left + self.then.seconds)}", refresh=False)


def duration(seconds: float) -> str:
    """12 s, 3 min 5 s, 2 h 10 min: as precise as a person reads an ETA ("unknown" before anything is done)."""
    if math.isnan(seconds):
        return "unknown"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _terminal_bar(what: str, total: float | None, unit: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True)


def _rate(per_second: float) -> str:
    """10,523 or 0.12: whole numbers where they say enough, two figures where they would round to 0."""
    return f"{per_second:,.0f}" if per_second >= 10 else f"{per_second:.2g}"
