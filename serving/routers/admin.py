"""`POST /v1/admin/reload`: ask the registry for a new champion now and hot-swap to it (serving.reloader);
`POST /v1/admin/adapters/{domain}`: hot-swap one domain's LoRA adapter of a domain-adapted bundle;
`POST /v1/admin/items`: add items the model never trained on, placed by their text (recsys.artifacts.added_items).

Mounted only with an admin token, behind it (serving.main, serving.security). Adapters are named, not located:
`{"version": V}` reads `<adapter_root>/<domain>/<V>.pt` and nothing else, so a caller cannot make the server open
(or probe for) any other file.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from recsys.artifacts.added_items import NewItem
from serving.deps import RecommenderDep, StateDep
from serving.http import StrictJsonRoute
from serving.loading import added_item_store
from serving.reloader import ReloadError
from serving.schemas import NOT_READY, UNPARSEABLE_BODY, AddItemsRequest, AddItemsResponse, error_responses

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=StrictJsonRoute)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # no separators, no leading dot: a name, never a path
ADAPTER_SUFFIX = ".pt"
MAX_ADAPTER_BYTES = 256 << 20


class ReloadResponse(BaseModel):
    reloaded: bool
    model_version: str
    registry_version: str | None


@router.post(
    "/reload",
    responses=error_responses(
        {
            409: "serving a fixed bundle, not a registered model",
            429: "asked again sooner than RECSYS_RELOAD_MIN_INTERVAL_S after the previous reload",
            503: "the registry's champion could not be loaded (the current model keeps serving)",
        }
    ),
)
def reload(state: StateDep) -> ReloadResponse:
    watcher, settings = state.watcher, state.settings
    if watcher is None:
        raise HTTPException(
            status_code=409, detail="serving a fixed bundle: start with a model name to follow its champion"
        )
    now = time.monotonic()
    wait = settings.reload_min_interval_s - (now - state.last_reload)
    if wait > 0:
        raise HTTPException(
            status_code=429,
            detail=f"the champion was checked less than {settings.reload_min_interval_s:g} s ago. "
            f"Fix: retry in {math.ceil(wait)} s",
            headers={"Retry-After": str(math.ceil(wait))},
        )
    state.last_reload = now
    try:
        reloaded = watcher.check()
    except ReloadError as err:
        raise HTTPException(status_code=503, detail=f"{err}. Fix: register a loadable bundle as champion") from err
    recommender = state.served()
    return ReloadResponse(reloaded=reloaded, model_version=recommender.version, registry_version=watcher.version)


class AdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # an old client's `path` is refused, not ignored

    version: str = Field(
        pattern=NAME_PATTERN, description=f"the adapter file <adapter_root>/<domain>/<version>{ADAPTER_SUFFIX}"
    )


class AdapterResponse(BaseModel):
    domain: str
    version: str
    model_version: str


@router.post(
    "/adapters/{domain}",
    # 422s (unknown domain, unusable file) are FastAPI's validation list, documented by FastAPI itself
    responses=error_responses(
        {
            400: UNPARSEABLE_BODY,
            404: "no such adapter version under the adapter root",
            409: "adapter swaps are off, the bundle has no domain adapters, or several workers serve",
            503: NOT_READY,
        }
    ),
)
def swap_adapter(
    domain: Annotated[str, PathParam(pattern=NAME_PATTERN)],
    body: AdapterRequest,
    state: StateDep,
    recommender: RecommenderDep,
) -> AdapterResponse:
    """Load the adapter into a copy of the served model and swap it in; requests in flight finish on the old one.
    A later champion reload replaces it with the registered bundle's adapters."""
    settings = state.settings
    if settings.adapter_root is None:
        raise HTTPException(status_code=409, detail="adapter swaps are off. Fix: set RECSYS_ADAPTER_ROOT")
    _one_worker(settings.workers, "an adapter swap", "register a bundle with the new adapter")
    if not recommender.domains:
        raise HTTPException(status_code=409, detail="this bundle has no domain adapters: nothing to swap")
    try:
        recommender.domain_index(domain)  # an unknown domain says so before any file is looked for
    except ValueError as err:
        raise RequestValidationError([{"type": "value_error", "loc": ("path", "domain"), "msg": str(err)}]) from err
    try:
        swapped = recommender.with_adapter(domain, _adapter_file(settings.adapter_root, domain, body.version))
    except ValueError as err:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "version"), "msg": str(err)}]) from err
    state.recommender = swapped
    logger.info("adapter %s version %s swapped in: serving %s", domain, body.version, swapped.version)
    return AdapterResponse(domain=domain, version=body.version, model_version=swapped.version)


@router.post(
    "/items",
    # 422s (bad fields, an id of the trained catalogue) are FastAPI's validation list, documented by FastAPI itself
    responses=error_responses(
        {
            400: UNPARSEABLE_BODY,
            409: "run-time items are off, several workers serve, the model cannot place new items, or the total would "
            "pass RECSYS_MAX_ADDED_ITEMS",
            503: NOT_READY,
        }
    ),
)
def add_items(body: AddItemsRequest, state: StateDep, recommender: RecommenderDep) -> AddItemsResponse:
    """Place new items by their text with the served model's content encoder and item tower, keep them (a restart or a
    hot swap serves them again, until a trained bundle includes them) and swap in a model that ranks them: the next
    request can return them. An id added before is replaced (an add is idempotent)."""
    settings = state.settings
    store = added_item_store(settings)
    if store is None:
        raise HTTPException(status_code=409, detail="run-time items are off. Fix: set RECSYS_ADDED_ITEMS_FILE")
    _one_worker(settings.workers, "an add", "retrain the bundle with the items")
    if not recommender.takes_new_items:
        raise HTTPException(
            status_code=409,
            detail=f"the served {recommender.name} model cannot place items it never trained on. Fix: serve a model "
            "trained with model.params.content_first: true (docs/models.md)",
        )
    known = set(recommender.in_catalogue([item.item_id for item in body.items]))
    if known:
        raise RequestValidationError(
            [
                {"type": "value_error", "loc": ("body", "items", i, "item_id"),
                 "msg": f"item {item.item_id!r} is in the trained catalogue: add only new items"}
                for i, item in enumerate(body.items) if item.item_id in known
            ]
        )  # fmt: skip
    items = [NewItem(item.item_id, item.title, dict(item.fields)) for item in body.items]
    with state.items_lock:  # the served model may have changed (an add, a hot swap) since this request began
        current = state.served()
        total = len({*(item.item_id for item in current.added_items), *(item.item_id for item in items)})
        if total > settings.max_added_items:
            raise HTTPException(
                status_code=409,
                detail=f"{total} run-time items would be kept, more than RECSYS_MAX_ADDED_ITEMS "
                f"({settings.max_added_items}). Fix: retrain the bundle with the items added so far",
            )
        swapped = current.with_items(items)
        store.save(swapped.added_items)  # kept before it serves: an acknowledged add survives a crash
        state.recommender = swapped
    distinct = len({item.item_id for item in items})
    state.metrics.items_added.inc(distinct)
    logger.info("%d items added at run time (%d live): serving %s", distinct, total, swapped.version)
    return AddItemsResponse(added=distinct, live=total, model_version=swapped.version)


def _one_worker(workers: int, change: str, otherwise: str) -> None:
    """409 when several worker processes serve: a change of the served model would reach only the one answering."""
    if workers > 1:
        raise HTTPException(
            status_code=409,
            detail=f"{change} would reach one of {workers} workers. Fix: serve with --workers 1, or {otherwise}",
        )


def _adapter_file(root: Path, domain: str, version: str) -> Path:
    """`<root>/<domain>/<version>.pt`, resolved (symlinks followed); 404, the same for a missing file, one that
    resolves outside the root and a link that never resolves (a loop), so an answer never says whether some other
    file exists."""
    root = root.resolve()
    try:
        path = (root / domain / f"{version}{ADAPTER_SUFFIX}").resolve()
        found = path.is_relative_to(root) and path.is_file()
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13), a path the OS refuses
        found = False
    if not found:
        raise HTTPException(
            status_code=404,
            detail=f"no adapter {version!r} for domain {domain!r} under the adapter root. Fix: write it with "
            f"save_adapter to <adapter_root>/{domain}/{version}{ADAPTER_SUFFIX}",
        )
    if path.stat().st_size > MAX_ADAPTER_BYTES:
        message = f"adapter {version!r} is larger than any adapter ({MAX_ADAPTER_BYTES >> 20} MiB): not one"
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "version"), "msg": message}])
    return path
