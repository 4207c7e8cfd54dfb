"""`/healthz` (the process answers) and `/readyz` (a model is loaded, the history store answers and the kept run-time
items can be written)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serving.deps import StateDep
from serving.history import HistoryUnavailableError
from serving.loading import added_item_store
from serving.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={503: {"model": Health, "description": "no model loaded yet"}})
def readyz(state: StateDep, response: Response) -> Health:
    """503 until a model is loaded; "degraded" (200) when the online history store is down, the kept run-time items
    cannot be written (an add would answer 507/503), or the registry's champion cannot be loaded (`reload_error`: the
    previous model keeps serving)."""
    watcher, store, recommender = state.watcher, state.history_store, state.recommender
    reload_error = None if watcher is None or watcher.failure is None else watcher.failure.error
    if recommender is None or store is None:
        response.status_code = 503
        return Health(status="degraded", detail="no model loaded", reload_error=reload_error)
    problems = []
    try:
        store.ping()
    except HistoryUnavailableError as err:
        problems.append(str(err))
    kept = added_item_store(state.settings)
    unwritable = None if kept is None else kept.write_problem()
    if unwritable is not None:
        problems.append(f"run-time items cannot be kept ({unwritable}): POST /v1/admin/items answers 507/503")
    return Health(
        status="ok" if not problems and reload_error is None else "degraded",
        model_version=recommender.version,
        history_store=type(store).__name__,
        detail="; ".join(problems) or None,
        reload_error=reload_error,
    )
