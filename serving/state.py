"""What the app holds, typed: one `ServingState` at `app.state.serving`, made by `create_app` and completed by its
lifespan (the history store, the micro-batcher, the champion watcher, the model); routers read it through
`serving.deps`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import HTTPException, Request

from serving.dashboard_cache import DashboardCache
from serving.loading import added_item_store, with_kept_items
from serving.metrics import ServingMetrics
from serving.recommender import Recommender
from serving.reloader import ChampionWatcher
from serving.settings import ServingSettings

if TYPE_CHECKING:
    from serving.batcher import MicroBatcher
    from serving.history import HistoryStore


@dataclass
class ServingState:
    settings: ServingSettings
    metrics: ServingMetrics
    dashboard_cache: DashboardCache
    admin_token: str | None  # None: the admin routes are not mounted
    api_keys: frozenset[str]  # empty: no key required
    # one change of the served items at a time: an add, a hot swap
    items_lock: threading.Lock = field(default_factory=threading.Lock)
    recommender: Recommender | None = None  # None until a model is loaded (/readyz says why)
    watcher: ChampionWatcher | None = None  # following a registered model's champion
    last_reload: float = float("-inf")  # monotonic seconds of the last admin reload
    # the lifespan's: set before the first request is served
    history_store: HistoryStore | None = None
    batcher: MicroBatcher | None = None

    def serve(self, loaded: Recommender) -> Recommender:
        """Swap in `loaded` (a bundle just loaded, at start-up or a hot swap) with the run-time items kept for it: the
        items added while it loaded are in the store, so it serves them too. Requests in flight keep the one they
        began with."""
        with self.items_lock:
            self.recommender = with_kept_items(loaded, added_item_store(self.settings))
            return self.recommender

    def served(self) -> Recommender:
        """The model being served; 503 before one is loaded."""
        if self.recommender is None:
            raise HTTPException(status_code=503, detail="no model loaded yet; see /readyz")
        return self.recommender


def state_of(request: Request) -> ServingState:
    state: ServingState = request.app.state.serving
    return state
