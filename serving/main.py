"""The online recommendation API: `create_app(settings)`; `recsys serve` runs it with uvicorn, one process or several
(`create_app_from_environment`, the factory each worker calls).

The lifespan loads the bundle (a directory, or the registered model's champion) into the app's typed state once
(`serving.state`); routers read it through `serving.deps`. The admin routes are mounted only when an admin token is
configured, and every route but the health probes and the metrics asks for an API key when keys are configured
(serving.security).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline

from recsys.artifacts.registry import resolve_bundle
from serving.batcher import MicroBatcher
from serving.dashboard_cache import DashboardCache
from serving.history import HistoryStore, HistoryUnavailableError, InMemoryHistoryStore, RedisHistoryStore
from serving.http import BodySizeLimit, validation_error_response
from serving.loading import added_item_store
from serving.metrics import ServingMetrics
from serving.recommender import Recommender
from serving.reloader import ChampionWatcher, ReloadError
from serving.routers import admin, dashboard, events, health, items, recommendations
from serving.schemas import TOO_LARGE, error_responses
from serving.security import AUTH_ERRORS, AdminOnly, ApiKeyGate, ApiKeyRequired
from serving.settings import ServingSettings
from serving.state import ServingState

logger = logging.getLogger(__name__)


def create_app(settings: ServingSettings | None = None) -> FastAPI:
    settings = settings or ServingSettings()
    state = ServingState(
        settings=settings,
        metrics=ServingMetrics(),
        dashboard_cache=DashboardCache(settings.dashboard_ttl_s),
        admin_token=settings.admin_secret(),
        api_keys=settings.api_keys(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        torch.set_num_threads(settings.torch_threads)
        stop_watching_collections = state.metrics.watch_collections()
        state.history_store = _started_history_store(settings, state.metrics)
        batcher = state.batcher = MicroBatcher(settings.max_batch, state.metrics)
        batcher.start()
        store = added_item_store(settings)
        state.kept = [] if store is None else store.load()
        if store is not None and settings.workers == 1:  # no other process writes them
            for leftover in store.remove_leftovers():
                logger.info("removed %s, left by a write that was killed", leftover)
        if settings.bundle is None and settings.model_name is not None:  # follow the registry's champion
            watcher = state.watcher = ChampionWatcher(settings, state.metrics, state.serve)
            with contextlib.suppress(ReloadError):  # logged; not ready (/readyz says why) until a check loads one
                watcher.check()
        else:
            state.serve(Recommender(resolve_bundle(settings.bundle, settings.model_name, settings.registry_uri)))
        if state.recommender is not None:
            logger.info("serving %s", state.recommender.version)
        poller = None
        if state.watcher is not None and settings.reload_interval_s > 0:
            poller = asyncio.create_task(state.watcher.poll(settings.reload_interval_s))
        yield
        if poller is not None:
            poller.cancel()
        await batcher.stop()
        state.changes.close()
        stop_watching_collections()
        gc.unfreeze()  # what was exempted is the interpreter's to collect again (at exit above all)

    # /docs and /redoc load Swagger UI and ReDoc from this server (fastapi-offline's copies), never from a CDN: the
    # pages work where the server's network reaches nothing else
    app = FastAPIOffline(title="recsys online API", version="1", lifespan=lifespan)
    app.state.serving = state
    state.metrics.live_added_items.set_function(lambda: _live_added_items(state))
    app.add_middleware(BodySizeLimit, max_body_bytes=settings.max_body_bytes)
    # before the body is read: anonymous is 401 first
    app.add_middleware(ApiKeyGate, api_keys=state.api_keys, refusal_delay_s=settings.refusal_delay_s)
    state.metrics.install(app)  # outermost: refused bodies and requests are counted too
    app.add_exception_handler(RequestValidationError, validation_error_response)
    too_large = error_responses({413: TOO_LARGE})
    public = [ApiKeyRequired] if state.api_keys else []
    public_errors = too_large | (AUTH_ERRORS if state.api_keys else {})
    for module in (recommendations, items, events):
        app.include_router(module.router, dependencies=public, responses=public_errors)
    for module in (health, dashboard):
        app.include_router(module.router)
    if state.admin_token is not None:
        app.include_router(admin.router, dependencies=[AdminOnly], responses=too_large | AUTH_ERRORS)
    else:
        logger.info("admin routes off (/v1/admin/* answer 404): set RECSYS_ADMIN_TOKEN or RECSYS_ADMIN_TOKEN_FILE")
    if state.api_keys:
        logger.info("every route but /healthz, /readyz and /metrics requires one of %d API keys (X-API-Key)",
                    len(state.api_keys))  # fmt: skip
    return app


def create_app_from_environment() -> FastAPI:
    """The app of the RECSYS_* environment: what each worker process of `recsys serve --workers N` builds."""
    return create_app(ServingSettings())


def _live_added_items(state: ServingState) -> float:
    """Run-time items the served model ranks (0 before a model is loaded)."""
    return 0.0 if state.recommender is None else float(len(state.recommender.added_items))


def _started_history_store(settings: ServingSettings, metrics: ServingMetrics) -> HistoryStore:
    """The configured store, asked once at start-up (a store that is down is logged, not fatal: recommendations
    are served from the bundle's histories meanwhile); its state feeds `recsys_history_store_up`."""
    store: HistoryStore
    if settings.history_store == "redis":
        store = RedisHistoryStore(settings.redis_url, settings.events_per_user, settings.history_ttl_s)
    else:
        store = InMemoryHistoryStore(settings.events_per_user, settings.max_users)
    try:
        store.ping()
        logger.info("history store: %s answers", settings.history_store)
    except HistoryUnavailableError:
        pass  # the store logged it
    metrics.history_store_up.set_function(lambda: float(store.available))
    return store
