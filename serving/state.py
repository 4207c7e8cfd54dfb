"""What the app holds, typed: one `ServingState` at `app.state.serving`, made by `create_app` and completed by its
lifespan (the history store, the micro-batcher, the champion watcher, the model); routers read it through
`serving.deps`."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import HTTPException, Request

from recsys.artifacts.added_items import NewItem
from serving.changes import ChangeThread
from serving.dashboard_cache import DashboardCache
from serving.loading import added_item_store, with_kept_items
from serving.metrics import ServingMetrics
from serving.recommender import Recommender
from serving.reloader import ChampionWatcher
from serving.settings import ServingSettings

if TYPE_CHECKING:
    from serving.batcher import MicroBatcher
    from serving.history import HistoryStore

logger = logging.getLogger(__name__)


@dataclass
class ServingState:
    settings: ServingSettings
    metrics: ServingMetrics
    dashboard_cache: DashboardCache
    admin_token: str | None  # None: the admin routes are not mounted
    api_keys: frozenset[str]  # empty: no key required
    # every change of the served model (a bundle loaded, an add, an adapter swap), one at a time, at low priority
    changes: ChangeThread = field(default_factory=ChangeThread)
    kept: list[NewItem] = field(default_factory=list)  # every run-time item acknowledged (the kept file's)
    recommender: Recommender | None = None  # None until a model is loaded (/readyz says why)
    watcher: ChampionWatcher | None = None  # following a registered model's champion
    last_reload: float = float("-inf")  # monotonic seconds of the last admin reload
    # the lifespan's: set before the first request is served
    history_store: HistoryStore | None = None
    batcher: MicroBatcher | None = None

    def serve(self, loaded: Recommender) -> Recommender:
        """Swap in `loaded` (a bundle just loaded, at start-up or a hot swap) with the run-time items kept for it: the
        items added while it loaded are kept too, so it serves them. `RecsysError` when it cannot serve them all: the
        current model keeps serving. Requests in flight keep the one they began with."""
        settings, store = self.settings, added_item_store(self.settings)
        served = self._swap_in(lambda: with_kept_items(loaded, self.kept, store, settings.max_added_items))
        if settings.gc_freeze:
            self.changes.run(exempt_loaded_objects_from_collection)
        if store is not None and served.takes_new_items:  # ready first; the first add finds the encoder loaded
            self.changes.submit(served.load_item_encoder, "loading the encoder of run-time items")
        return served

    def change(self, make: Callable[[Recommender], Recommender]) -> Recommender:
        """Swap in `make(served)`, made on the change thread from the model served when its turn comes (not the one a
        request began with: a swap or an add may have come between); what `make` raises leaves it serving."""
        return self._swap_in(lambda: make(self.served()))

    def _swap_in(self, make: Callable[[], Recommender]) -> Recommender:
        def made() -> Recommender:
            self.recommender = make()
            return self.recommender

        return self.changes.run(made)

    def served(self) -> Recommender:
        """The model being served; 503 before one is loaded."""
        if self.recommender is None:
            raise HTTPException(status_code=503, detail="no model loaded yet; see /readyz")
        return self.recommender


def exempt_loaded_objects_from_collection() -> None:
    """Python's full collections walk every object the process tracks, a loaded model's among them,
    and stop every request while they do (`recsys_gc_pause_seconds{generation="2"}`). Frozen, the objects loaded so
    far are skipped by them; after a swap the previous model's leftovers are collected once first."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    logger.info("%d objects exempted from garbage collection", gc.get_freeze_count())


def state_of(request: Request) -> ServingState:
    state: ServingState = request.app.state.serving
    return state
