"""`GET /dashboard`: the offline evaluation dashboard (pipelines.dashboard), one HTML page.

It reads the MLflow store the API's registry lives in (settings.registry_uri): runs, metric comparison, slices of the
latest evaluate runs, semantic-ID health. Reading and drawing cost up to seconds of CPU, so a page is rendered once
per state of the store and served from a cache (`DashboardCache`): a SQLite store's state is its file's size and
modification time (a new evaluation, run or promotion changes it); any other store is read again at most every
`dashboard_ttl_s`. Each page carries an ETag: a client that has it gets 304. plotly.js (4.8 MB) is not in the page:
it is `GET /dashboard/plotly-<version>.min.js`, cached by the browser for good (the version is in its name).

When the API serves a bundle directory without a tracking URI given, it has no store: the page then says how to name
one, never a 500; a store that cannot be read (a SQLite file that does not exist, a database that does not answer)
is a 503 page that names it and the fix. With API keys on, the page and the script need one (serving.security).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated

import plotly
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from pipelines.dashboard import DashboardUnavailable, from_mlflow, render_dashboard, render_message
from pipelines.tracking import configured_tracking_uri, sqlite_path
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"])

PLOTLY_JS_PATH = f"/dashboard/plotly-{plotly.__version__}.min.js"
MAX_CACHED_PAGES = 16  # one per `experiment` filter asked for; the least recently asked is dropped first


def dashboard_tracking_uri(settings: ServingSettings) -> str | None:
    """The MLflow store the dashboard reads: the registry's when the API follows a registered model; when it
    serves a bundle directory, only a store named (`--tracking-uri`, RECSYS_TRACKING_URI, MLFLOW_TRACKING_URI)."""
    if settings.bundle is not None:
        return configured_tracking_uri(settings.tracking_uri)
    return settings.registry_uri


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

    async def page(self, uri: str, experiment: str | None) -> Page:
        """The page of `uri` (only `experiment`'s runs when given): cached, or rendered now (DashboardUnavailable
        when the store cannot be read)."""
        key = (uri, experiment)
        async with self.lock:
            state = self.state(uri)
            cached = self.pages.get(key)
            if cached is None or cached.state != state:
                data = await run_in_threadpool(from_mlflow, uri, experiment)
                html = await run_in_threadpool(render_dashboard, data, PLOTLY_JS_PATH)
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


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)  # a page for people, like /docs
async def dashboard(
    request: Request,
    experiment: Annotated[str | None, Query(max_length=256, description="Only this MLflow experiment.")] = None,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Runs table, metric comparison across runs, slices and semantic-ID health, from MLflow (HTML)."""
    uri = dashboard_tracking_uri(request.app.state.settings)
    if uri is None:
        page = render_message(
            "Evaluation dashboard: no MLflow store",
            "This API serves a bundle directory, so it does not know which MLflow store holds the runs.",
            "start it with --tracking-uri URI or RECSYS_TRACKING_URI=URI (the tracking.uri your pipelines log to, e.g. "
            "sqlite:////ABSOLUTE/PATH/mlflow.db), or serve the registered model instead: "
            "recsys serve --model-name NAME --tracking-uri URI",
        )
        return HTMLResponse(page)
    try:
        page_ = await request.app.state.dashboard_cache.page(uri, experiment)
    except DashboardUnavailable as err:
        logger.warning("dashboard: %s", err)
        message, _, fix = str(err).partition(" Fix: ")
        return HTMLResponse(render_message("Evaluation dashboard: MLflow store unavailable", message, fix), 503)
    headers = {"ETag": page_.etag, "Cache-Control": "no-cache"}  # the browser asks again, and gets 304 if unchanged
    if if_none_match == page_.etag:
        return Response(status_code=304, headers=headers)
    return HTMLResponse(page_.html, headers=headers)


@router.get(PLOTLY_JS_PATH, include_in_schema=False)
def plotly_js() -> Response:
    """The plotly.js the dashboard's charts run on: its version is in the path, so it is cached for good."""
    return Response(
        _plotly_js(), media_type="text/javascript", headers={"Cache-Control": "public, max-age=31536000, immutable"}
    )


@cache
def _plotly_js() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()
