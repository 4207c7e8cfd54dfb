"""`GET /dashboard`: the offline evaluation dashboard (recsys.dashboard), one HTML page.

It reads the MLflow store the API's registry lives in (settings.registry_uri): runs, metric comparison, slices of the
latest evaluate runs, semantic-ID health. Reading and drawing cost up to seconds of CPU, so a page is rendered once
per state of the store and served from a cache (`serving.dashboard_cache`): a SQLite store's state is its file's size
and modification time (a new evaluation, run or promotion changes it); any other store is read again at most every
`dashboard_ttl_s`. Each page carries an ETag: a client that has it gets 304. plotly.js (4.8 MB) is not in the page:
it is `GET /dashboard/plotly-<version>.min.js`, cached by the browser for good (the version is in its name).

When the API serves a bundle directory without a tracking URI given, it has no store: the page then says how to name
one, never a 500; a store that cannot be read (a SQLite file that does not exist, a database that does not answer)
is a 503 page that names it and the fix. With API keys on, the page and the script need one (serving.security).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import HTMLResponse

from recsys.artifacts.registry import configured_tracking_uri
from recsys.errors import MissingExtra
from recsys.runtime.extras import optional
from serving.settings import ServingSettings
from serving.state import state_of

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"])


def _plotly_version() -> str:
    try:
        return metadata.version("plotly")
    except metadata.PackageNotFoundError:  # the dashboard's extra is not installed: its page says so
        return "absent"


PLOTLY_JS_PATH = f"/dashboard/plotly-{_plotly_version()}.min.js"


def dashboard_tracking_uri(settings: ServingSettings) -> str | None:
    """The MLflow store the dashboard reads: the registry's when the API follows a registered model; when it
    serves a bundle directory, only a store named (`--tracking-uri`, RECSYS_TRACKING_URI, MLFLOW_TRACKING_URI)."""
    if settings.bundle is not None:
        return configured_tracking_uri(settings.tracking_uri)
    return settings.registry_uri


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)  # a page for people, like /docs
async def dashboard(
    request: Request,
    experiment: Annotated[str | None, Query(max_length=256, description="Only this MLflow experiment.")] = None,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Runs table, metric comparison across runs, slices and semantic-ID health, from MLflow (HTML)."""
    try:
        dashboard = _dashboard()
    except MissingExtra as err:
        logger.warning("dashboard: %s", err)
        return HTMLResponse(_missing_extra_page(err), 503)
    state = state_of(request)
    uri = dashboard_tracking_uri(state.settings)
    if uri is None:
        page = dashboard.render_message(
            "Evaluation dashboard: no MLflow store",
            "This API serves a bundle directory, so it does not know which MLflow store holds the runs.",
            "start it with --tracking-uri URI or RECSYS_TRACKING_URI=URI (the tracking.uri your pipelines log to, e.g. "
            "sqlite:////ABSOLUTE/PATH/mlflow.db), or serve the registered model instead: "
            "recsys serve --model-name NAME --tracking-uri URI",
        )
        return HTMLResponse(page)
    try:
        page_ = await state.dashboard_cache.page(uri, experiment, _renderer(dashboard))
    except dashboard.DashboardUnavailable as err:
        logger.warning("dashboard: %s", err)
        message, _, fix = str(err).partition(" Fix: ")
        title = "Evaluation dashboard: MLflow store unavailable"
        return HTMLResponse(dashboard.render_message(title, message, fix), 503)
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


def _renderer(dashboard: ModuleType) -> Callable[[str, str | None], str]:
    """(store, experiment filter) -> the page: its runs read from MLflow and drawn (seconds of CPU: the cache's)."""
    return lambda uri, experiment: dashboard.render_dashboard(dashboard.from_mlflow(uri, experiment), PLOTLY_JS_PATH)


def _dashboard() -> ModuleType:
    """`recsys.dashboard`, imported on the first request for the page (it reads MLflow and draws with plotly, which a
    server that is never asked for it need not load); `MissingExtra` when its extra is not installed."""
    optional("plotly", extra="dashboard", feature="the evaluation dashboard")
    optional("mlflow", extra="dashboard", feature="the evaluation dashboard")
    import recsys.dashboard

    return recsys.dashboard


def _missing_extra_page(err: MissingExtra) -> str:
    """A plain page saying which extra the dashboard needs (its own renderer is what is missing)."""
    return (
        "<!doctype html><title>Evaluation dashboard: not installed</title>"
        f"<h1>Evaluation dashboard: not installed</h1><p>{html.escape(str(err))}</p>"
    )
