"""`POST /v1/admin/reload`: ask the registry for a new champion now and hot-swap to it (serving.reloader)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel

from serving.schemas import error_responses

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class ReloadResponse(BaseModel):
    reloaded: bool
    model_version: str
    registry_version: str | None


@router.post("/reload", responses=error_responses({409: "serving a fixed bundle, not a registered model"}))
def reload(request: Request) -> ReloadResponse:
    watcher = request.app.state.watcher
    if watcher is None:
        raise HTTPException(
            status_code=409, detail="serving a fixed bundle: start with a model name to follow its champion"
        )
    reloaded = watcher.check()
    return ReloadResponse(
        reloaded=reloaded, model_version=request.app.state.recommender.version, registry_version=watcher.version
    )
