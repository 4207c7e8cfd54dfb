"""`/healthz` (the process answers) and `/readyz` (a model is loaded and the history store answers)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serving.deps import StateDep
from serving.history import HistoryUnavailableError
from serving.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={503: {"model": Health, "description": "no model loaded yet"}})
def readyz(state: StateDep, response: Response) -> Health:
    """503 until a model is loaded; "degraded" (200) when the online history store is down or the registry's
    champion cannot be loaded (`reload_error`: the previous model keeps serving)."""
    watcher, store, recommender = state.watcher, state.history_store, state.recommender
    reload_error = None if watcher is None or watcher.failure is None else watcher.failure.error
    if recommender is None or store is None:
        response.status_code = 503
        return Health(status="degraded", detail="no model loaded", reload_error=reload_error)
    store_name = type(store).__name__
    try:
        store.ping()
    except HistoryUnavailableError as err:
        return Health(
            status="degraded", model_version=recommender.version, history_store=store_name, detail=str(err),
            reload_error=reload_error,
        )  # fmt: skip
    return Health(
        status="ok" if reload_error is None else "degraded",
        model_version=recommender.version,
        history_store=store_name,
        reload_error=reload_error,
    )
