"""`GET /dashboard`: the offline evaluation dashboard (pipelines.dashboard), one self-contained HTML page.

It reads the MLflow store the API's registry lives in (settings.registry_uri) on every request: runs,
metric comparison, slices of the latest evaluate runs, semantic-ID health. When the API serves a bundle
directory without a tracking URI given, it has no store: the page then says how to name one, never a 500;
a store that cannot be read (a SQLite file that does not exist, a database that does not answer) is a 503
page that names it and the fix.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from pipelines.dashboard import DashboardUnavailable, from_mlflow, render_dashboard, render_message
from pipelines.tracking import configured_tracking_uri
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"])


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
) -> HTMLResponse:
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
        data = await run_in_threadpool(from_mlflow, uri, experiment)
    except DashboardUnavailable as err:
        logger.warning("dashboard: %s", err)
        message, _, fix = str(err).partition(" Fix: ")
        page = render_message("Evaluation dashboard: MLflow store unavailable", message, fix)
        return HTMLResponse(page, status_code=503)
    return HTMLResponse(await run_in_threadpool(render_dashboard, data))
