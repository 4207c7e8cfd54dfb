"""Changes of the served model, one at a time, on one thread of the lowest CPU priority.

A change (a bundle just loaded getting the kept run-time items, an add of items, an adapter swap) makes a new
`Recommender` from the one served and swaps it in with one assignment (`serving.state.ServingState.change`). Placing
items embeds their texts, seconds of CPU for a thousand of them; on the request path's cores that is the stall the
requests served beside it would feel (p99 19 -> 466 ms under wrk for a 1,000-item add on 2 cores). So every change
runs on `ChangeThread`: one thread (changes never interleave, so none loses another's items), 19 nice steps below the
server's own on Linux (the scheduler gives the event loop and the model thread the cores whenever they want them), and
the caller waits for it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

logger = logging.getLogger(__name__)

LOWER_PRIORITY_BY = 19  # nice steps below the server's own (each ~1.25x less CPU when cores are contended)
T = TypeVar("T")


class ChangeThread:
    """Runs each change on one low-priority thread, in the order they come; `run` waits for its change's result."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="recsys-changes", initializer=_lowest_priority)

    def run(self, change: Callable[[], T]) -> T:
        """`change()` run on the change thread; what it returns, or what it raises. Never call it from a change."""
        return self._executor.submit(change).result()

    def submit(self, change: Callable[[], object], what: str) -> None:
        """Run `change()` on the change thread without waiting for it; what it raises is logged, naming `what`."""
        self._executor.submit(change).add_done_callback(lambda done: _log_failure(done, what))

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _log_failure(done: Future[object], what: str) -> None:
    error = done.exception()
    if error is not None:
        logger.error("%s failed: %s: %s", what, type(error).__name__, error)


def _lowest_priority() -> None:
    """Lower the calling thread's CPU priority by `LOWER_PRIORITY_BY` from the server's (Linux's nice applies to the
    calling thread alone; capped at 19, the lowest)."""
    try:
        os.nice(LOWER_PRIORITY_BY)
    except (AttributeError, OSError) as err:  # not a Unix: changes then run at the requests' priority
        logger.info("changes of the served model run at the requests' priority (%s)", err)
