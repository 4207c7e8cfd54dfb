"""Progress of a long step in the log: how far, how fast (rows/s) and, where the total is known, the ETA.

A prepare of 10^8 interactions or an evaluation of 10^6 users runs for minutes; one line every few seconds says it is
alive and when it will end, without flooding the log of a small run (which finishes before the first line is due).
Terminals may show a tqdm bar as well; this is what a log reader (a pipeline's, a service's) sees.

Example:
    >>> progress = Progress(logging.getLogger("demo"), "reading", total=100.0, unit="MB")
    >>> progress.update(done=50.0, rows=1_000)
    >>> progress.rows
    1000
"""

from __future__ import annotations

import logging
import time

EVERY_SECONDS = 5.0  # read when a `Progress` is made, so a test may shorten it


class Progress:
    """Logs `what` at INFO: done of total (with the ETA) or done alone, and rows/s, at most once per `every` seconds.

    Args:
        logger: the logger of the module doing the work.
        what: what is under way, e.g. "reading user_sequence.txt".
        total: the amount of work in `unit`s (bytes, parts), or None when it is not known in advance.
        unit: the unit of `done` and `total`, e.g. "MB" or "parts".
        rows_are: what a row is, e.g. "lines"; when it is `unit` (users done, users counted), the count is said once.
        every: seconds between two lines; None: `EVERY_SECONDS`.
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
    ):
        self.logger = logger
        self.what = what
        self.total = total
        self.unit = unit
        self.rows_are = rows_are
        self.every = EVERY_SECONDS if every is None else every
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
        elapsed = max(now - self._start, 1e-9)
        rate = f"{_rate(self.rows / elapsed)} {self.rows_are}/s"
        counted = rate if self.rows_are == self.unit else f"{self.rows:,} {self.rows_are}, {rate}"
        if self.total:
            eta = elapsed * (self.total - done) / done if done else float("nan")
            share = f"{done:,.0f} of {self.total:,.0f} {self.unit} ({done / self.total:.0%})"
            self.logger.info("%s: %s, %s, ETA %.0f s", self.what, share, counted, eta)
        else:
            self.logger.info("%s: %s %s, %s", self.what, f"{done:,.0f}", self.unit, counted)

    def finish(self) -> None:
        """Log the totals: rows, seconds and rows/s."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = f"{_rate(self.rows / elapsed)} {self.rows_are}/s"
        self.logger.info("%s: done, %s %s in %.1f s (%s)", self.what, f"{self.rows:,}", self.rows_are, elapsed, rate)


def _rate(per_second: float) -> str:
    """10,523 or 0.12: whole numbers where they say enough, two figures where they would round to 0."""
    return f"{per_second:,.0f}" if per_second >= 10 else f"{per_second:.2g}"
