"""Hot swap: serve the registered model's new champion as soon as the champion gate promotes one.

`ChampionWatcher.check()` asks the registry which version holds the `champion` alias; when it differs from
the one being served, it loads the new bundle *beside* the old one and then replaces `app.state.recommender`
in one assignment. A request holds the recommender it started with (through `serving.deps`), so requests in
flight finish on the old model and none fails; the next ones get the new model. The lifespan runs `check`
every `reload_interval_s` seconds in the background; `POST /v1/admin/reload` runs it at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from pipelines.registry import download_bundle, get_champion
from serving.recommender import Recommender
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)


class ChampionWatcher:
    def __init__(self, settings: ServingSettings, state: Any) -> None:
        if settings.model_name is None:
            raise ValueError("hot swap follows a registered model: set model_name")
        self.settings, self.state = settings, state
        self.version: str | None = None  # the registry version being served
        self._lock = threading.Lock()  # one load at a time

    def check(self) -> bool:
        """Load and swap in the champion if it changed; True when it swapped."""
        assert self.settings.model_name is not None
        with self._lock:
            # one lookup gives the version and its bundle, so the version served is the one recorded
            current = get_champion(self.settings.model_name, self.settings.registry_uri)
            if current is None or current.version == self.version:
                return False
            bundle = download_bundle(current.source, self.settings.registry_uri)
            recommender = Recommender(bundle)  # loaded before the swap: the old one serves meanwhile
            self.state.recommender, previous, self.version = recommender, self.version, current.version
        logger.info("serving champion v%s of %s (was v%s)", current.version, self.settings.model_name, previous)
        return True

    async def poll(self, interval_s: float) -> None:
        """Check every `interval_s` seconds until cancelled; a failed check is logged and retried."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # a registry hiccup must not stop serving the current model
                logger.exception("champion check failed; still serving v%s", self.version)
