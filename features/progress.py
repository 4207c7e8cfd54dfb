"""Progress of long data work in the log: how far, how fast (rows/s) and, where the total is known, the ETA.

A prepare of 10^8 interactions runs for minutes; one line every few seconds says it is alive and when it will end,
without flooding the log of a small prepare (which finishes before the first line is due).

Example:
    >>> progress = Progress(logging.getLogger("demo"), "reading", total=100.0, unit="MB")
    >>> progress.update(done=50.0, rows=1_000)
    >>> progress.rows
    1000
"""

from __future__ import annotations

import logging
import time

EVERY_SECONDS = 5.0


class Progress:
    """Logs `what` at INFO: done of total (with the ETA) or done alone, and rows/s, at most once per `every` seconds.

    Args:
        logger: the logger of the module doing the work.
        what: what is under way, e.g. "reading user_sequence.txt".
        total: the amount of work in `unit`s (bytes, parts), or None when it is not known in advance.
        unit: the unit of `done` and `total`, e.g. "MB" or "parts".
        rows_are: what a row is, e.g. "lines".
        every: seconds between two lines.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        total: float | None,
        unit: str,
        rows_are: str = "rows",
        every: float = EVERY_SECONDS,
    ):
        self.logger = logger
        self.what = what
        self.total = total
        self.unit = unit
        self.rows_are = rows_are
        self.every = every
        self.rows = 0
        self._start = time.monotonic()
        self._last_log = self._start

    def update(self, *, done: float, rows: int) -> None:
        """Record that `done` units of work are done (a running total) and `rows` more rows were handled."""
        self.rows += rows
        now = time.monotonic()
        if now - self._last_log < self.every:
            return
        self._last_log = now
        elapsed = now - self._start
        counted = f"{self.rows:,} {self.rows_are}, {self.rows / elapsed:,.0f} {self.rows_are}/s"
        if self.total:
            eta = elapsed * (self.total - done) / done if done else float("nan")
            share = f"{done:,.0f} of {self.total:,.0f} {self.unit} ({done / self.total:.0%})"
            self.logger.info("%s: %s, %s, ETA %.0f s", self.what, share, counted, eta)
        else:
            self.logger.info("%s: %s %s, %s", self.what, f"{done:,.0f}", self.unit, counted)

    def finish(self) -> None:
        """Log the totals: rows, seconds and rows/s."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = f"{self.rows / elapsed:,.0f} {self.rows_are}/s"
        self.logger.info("%s: done, %s %s in %.1f s (%s)", self.what, f"{self.rows:,}", self.rows_are, elapsed, rate)
