"""`POST /v1/admin/reload`: ask the registry for a new champion now and hot-swap to it (serving.reloader);
`POST /v1/admin/adapters/{domain}`: hot-swap one domain's LoRA adapter of a domain-adapted bundle;
`POST /v1/admin/items`: add items the model never trained on, placed by their text (recsys.artifacts.added_items).

Mounted only with an admin token, behind it (serving.main, serving.security). Adapters are named, not located:
`{"version": V}` reads `<adapter_root>/<domain>/<V>.pt` and nothing else, so a caller cannot make the server open
(or probe for) any other file.
"""

from __future__ import annotations

import errno
import logging
import math
import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from recsys.artifacts.added_items import NewItem, merged
from serving.deps import RecommenderDep, StateDep
from serving.http import StrictJsonRoute
from serving.loading import added_item_store
from serving.recommender import CannotPlaceItems, InTrainedCatalogue, Recommender
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
    """Load the adapter into a copy of the served model (the one served when the change's turn comes: an add may have
    come between) and swap it in; requests in flight finish on the old one.
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
    path = _adapter_file(settings.adapter_root, domain, body.version)
    try:
        swapped = state.change(lambda current: current.with_adapter(domain, path))
    except ValueError as err:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "version"), "msg": str(err)}]) from err
    logger.info("adapter %s version %s swapped in: serving %s", domain, body.version, swapped.version)
    return AdapterResponse(domain=domain, version=body.version, model_version=swapped.version)


@router.post(
    "/items",
    # 422s (bad fields, an id of the trained catalogue) are FastAPI's validation list, documented by FastAPI itself
    responses=error_responses(
        {
            400: UNPARSEABLE_BODY,
            409: "run-time items are off, several workers serve, the model cannot place new items, or the items it "
            "would place pass RECSYS_MAX_ADDED_ITEMS",
            503: f"{NOT_READY}, or the kept file cannot be written (nothing added)",
            507: "no space left for the kept file (nothing added)",
        }
    ),
)
def add_items(body: AddItemsRequest, state: StateDep) -> AddItemsResponse:
    """Place new items by their text with the served model's content encoder and item tower, keep them (every bundle
    served later serves them: a restart, a hot swap, a rollback) and swap in a model that ranks them: the next request
    can return them. An id added before is replaced (an add is idempotent). The work runs off the request path
    (`serving.changes`), against the model served when its turn comes."""
    settings = state.settings
    store = added_item_store(settings)
    if store is None:
        raise HTTPException(status_code=409, detail="run-time items are off. Fix: set RECSYS_ADDED_ITEMS_FILE")
    _one_worker(settings.workers, "an add", "retrain the bundle with the items")
    items = _new_items(body)
    ids = {item.item_id for item in items}

    def add(current: Recommender) -> Recommender:
        try:
            swapped = current.with_items(items, store.embeddings_dir, settings.max_added_items)
            kept = merged(state.kept, items)
            store.save(kept)  # kept before it serves: an acknowledged add survives a crash
        except CannotPlaceItems as err:
            raise HTTPException(status_code=409, detail=str(err)) from err
        except InTrainedCatalogue as err:
            raise _in_catalogue(body, set(err.item_ids)) from err
        except OSError as err:
            raise _not_kept(store.path, err) from err
        state.kept = kept
        return swapped

    swapped = state.change(add)
    state.metrics.items_added.inc(len(ids))
    live = len(swapped.added_items)
    logger.info("%d items added at run time (%d live): serving %s", len(ids), live, swapped.version)
    return AddItemsResponse(added=len(ids), live=live, model_version=swapped.version)


def _new_items(body: AddItemsRequest) -> list[NewItem]:
    """The request's items, checked as the kept file's are (`NewItem`): 422 naming the entry otherwise."""
    items, errors = [], []
    for i, item in enumerate(body.items):
        try:
            items.append(NewItem(item.item_id, item.title, dict(item.fields)))
        except ValueError as err:
            errors.append({"type": "value_error", "loc": ("body", "items", i), "msg": str(err)})
    if errors:
        raise RequestValidationError(errors)
    return items


def _in_catalogue(body: AddItemsRequest, known: set[str]) -> RequestValidationError:
    """A 422 naming each item whose id the served model's trained catalogue holds."""
    return RequestValidationError(
        [
            {"type": "value_error", "loc": ("body", "items", i, "item_id"),
             "msg": f"item {item.item_id!r} is in the trained catalogue: add only new items"}
            for i, item in enumerate(body.items) if item.item_id in known
        ]
    )  # fmt: skip


def _not_kept(path: Path, err: OSError) -> HTTPException:
    """507 when the kept file's disk is full, 503 when it cannot be written otherwise: nothing was added."""
    full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    fix = "free space on its disk" if full else "make its directory writable"
    return HTTPException(
        status_code=507 if full else 503,
        detail=f"the items were not added: {path.name} (the kept run-time items) cannot be written "
        f"({err.strerror or err}); the served model and the file are as they were. Fix: {fix}, then send the same "
        "request again",
    )


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
