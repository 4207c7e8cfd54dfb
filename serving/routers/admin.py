"""`POST /v1/admin/reload`: ask the registry for a new champion now and hot-swap to it (serving.reloader);
`POST /v1/admin/adapters/{domain}`: hot-swap one domain's LoRA adapter of a domain-adapted bundle."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from serving.deps import RecommenderDep
from serving.schemas import NOT_READY, UNPARSEABLE_BODY, error_responses

logger = logging.getLogger(__name__)

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


class AdapterRequest(BaseModel):
    path: str = Field(min_length=1, description="an adapter file written by recsys.modules.lora.save_adapter")


class AdapterResponse(BaseModel):
    domain: str
    model_version: str


@router.post(
    "/adapters/{domain}",
    # 422s (unknown domain, unusable file) are FastAPI's validation list, documented by FastAPI itself
    responses=error_responses({400: UNPARSEABLE_BODY, 409: "the bundle has no domain adapters", 503: NOT_READY}),
)
def swap_adapter(domain: str, body: AdapterRequest, request: Request, recommender: RecommenderDep) -> AdapterResponse:
    """Load the file into a copy of the served model and swap it in; requests in flight finish on the old one.
    A later champion reload replaces it with the registered bundle's adapters."""
    if not recommender.domains:
        raise HTTPException(status_code=409, detail="this bundle has no domain adapters: nothing to swap")
    try:
        swapped = recommender.with_adapter(domain, Path(body.path))
    except ValueError as err:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "path"), "msg": str(err)}]) from err
    request.app.state.recommender = swapped
    logger.info("adapter %s swapped in from %s: serving %s", domain, body.path, swapped.version)
    return AdapterResponse(domain=domain, model_version=swapped.version)
