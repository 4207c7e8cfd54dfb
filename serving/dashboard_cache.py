"""The dashboard's rendered pages (`serving.routers.dashboard`), cached per state of their MLflow store.

Reading and drawing cost up to seconds of CPU, so a page is rendered once per state of the store: a SQLite store's
state is its file's size and modification time (a new evaluation, run or promotion changes it); any other store is
read again at most every `ttl_s`. One render at a time, so a crowd of requests for a stale page costs one render.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi.concurrency import run_in_threadpool

from recsys.artifacts.registry import sqlite_path

logger = logging.getLogger(__name__)

MAX_CACHED_PAGES = 16  # one per `experiment` filter asked for; the least recently asked is dropped first
Render = Callable[[str, str | None], str]  # (store URI, experiment filter) -> the page's HTML


@dataclass(frozen=True)
class Page:
    state: tuple[object, ...]  # the store's state it was rendered from
    etag: str
    html: str


class DashboardCache:
    """Rendered pages by (store, experiment filter), each kept while its store's state is unchanged; one render at a
    time, so a crowd of requests for a stale page costs one render, not one each."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.pages: OrderedDict[tuple[str, str | None], Page] = OrderedDict()
        self.lock = asyncio.Lock()

    def state(self, uri: str) -> tuple[object, ...]:
        """What changes when the store does: a SQLite file's (and its write-ahead log's) size and mtime; else the
        current `ttl_s` window."""
        db = sqlite_path(uri)
        if db is None:
            return ("window", int(time.monotonic() // self.ttl_s))
        return tuple(_stat(path) for path in (db, db.with_name(f"{db.name}-wal")))

    async def page(self, uri: str, experiment: str | None, render: Render) -> Page:
        """The page of `uri` (only `experiment`'s runs when given): cached, or made now by `render` (whose errors, a
        store that cannot be read, propagate)."""
        key = (uri, experiment)
        async with self.lock:
            state = self.state(uri)
            cached = self.pages.get(key)
            if cached is None or cached.state != state:
                html = await run_in_threadpool(render, uri, experiment)
                cached = Page(state, f'"{hashlib.sha256(html.encode()).hexdigest()[:32]}"', html)
                self.pages[key] = cached
                logger.info("dashboard rendered (%s, experiment %s): %d bytes", uri, experiment, len(html))
            self.pages.move_to_end(key)
            while len(self.pages) > MAX_CACHED_PAGES:
                self.pages.popitem(last=False)
            return cached


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns
