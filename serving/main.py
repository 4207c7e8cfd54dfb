"""The online recommendation API: `create_app(settings)`; `recsys serve` runs it with uvicorn.

The lifespan loads the bundle (a directory, or the registered model's champion) into `app.state` once;
routers read it through `serving.deps`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from pipelines.registry import resolve_bundle
from serving.batcher import MicroBatcher
from serving.history import HistoryStore, InMemoryHistoryStore, RedisHistoryStore
from serving.metrics import ServingMetrics
from serving.recommender import Recommender
from serving.reloader import ChampionWatcher
from serving.routers import admin, dashboard, events, health, items, recommendations
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)


def create_app(settings: ServingSettings | None = None) -> FastAPI:
    settings = settings or ServingSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        torch.set_num_threads(settings.torch_threads)
        app.state.history_store = make_history_store(settings)
        app.state.batcher = MicroBatcher(settings.max_batch, app.state.metrics)
        app.state.batcher.start()
        app.state.watcher = None
        if settings.bundle is None and settings.model_name is not None:  # follow the registry's champion
            app.state.watcher = ChampionWatcher(settings, app.state)
            app.state.watcher.check()
        else:
            app.state.recommender = Recommender(
                resolve_bundle(settings.bundle, settings.model_name, settings.registry_uri)
            )
        logger.info("serving %s", app.state.recommender.version)
        poller = None
        if app.state.watcher is not None and settings.reload_interval_s > 0:
            poller = asyncio.create_task(app.state.watcher.poll(settings.reload_interval_s))
        yield
        if poller is not None:
            poller.cancel()
        await app.state.batcher.stop()

    app = FastAPI(title="recsys online API", version="1", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = ServingMetrics()
    app.state.metrics.install(app)
    for module in (recommendations, items, events, health, admin, dashboard):
        app.include_router(module.router)
    return app


def make_history_store(settings: ServingSettings) -> HistoryStore:
    if settings.history_store == "redis":
        return RedisHistoryStore(settings.redis_url, settings.events_per_user)
    return InMemoryHistoryStore(settings.events_per_user)
