"""Hot swap: serve the registered model's new champion as soon as the champion gate promotes one.

`ChampionWatcher.check()` asks the registry which version holds the `champion` alias; when it differs from the one being
served, it loads the new bundle *beside* the old one and then swaps it in (`ServingState.serve`: the run-time items kept
for it, one assignment). A request holds the recommender it started with (through `serving.deps`), so requests in flight
finish on the old model and none fails; the next ones get the new model. The lifespan runs `check` every
`reload_interval_s` seconds in the background; `POST /v1/admin/reload` runs it at once.

A champion that cannot be loaded leaves the current model serving: the failure is kept (`/readyz` reports it), counted
(`recsys_model_reload_failures_total`) and logged once per distinct error, not on every retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from recsys.artifacts.registry import download_bundle, get_champion
from serving.metrics import ServingMetrics
from serving.recommender import Recommender
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)


class ReloadError(RuntimeError):
    """The registry's champion could not be loaded; the model served before keeps serving."""


@dataclass(frozen=True)
class ReloadFailure:
    version: str | None  # the champion that failed to load (None: the registry itself did not answer)
    error: str


class ChampionWatcher:
    """Follows `settings.model_name`'s champion; `serve` swaps a loaded one in (`ServingState.serve`)."""

    def __init__(
        self, settings: ServingSettings, metrics: ServingMetrics, serve: Callable[[Recommender], object]
    ) -> None:
        if settings.model_name is None:
            raise ValueError("hot swap follows a registered model: set model_name")
        self.settings, self.metrics, self.serve = settings, metrics, serve
        self.version: str | None = None  # the registry version being served
        self.failure: ReloadFailure | None = None  # the last check's failure, until a check succeeds
        self._lock = threading.Lock()  # one load at a time

    def check(self) -> bool:
        """Load and swap in the champion if it changed; True when it swapped. `ReloadError` when the champion (or
        the registry) fails: the current model keeps serving."""
        assert self.settings.model_name is not None
        with self._lock:
            champion_version = None
            try:
                # one lookup gives the version and its bundle, so the version served is the one recorded
                current = get_champion(self.settings.model_name, self.settings.registry_uri)
                if current is None or current.version == self.version:
                    self.failure = None
                    return False
                champion_version = current.version
                # loaded before the swap: the old one serves meanwhile
                self.serve(Recommender(download_bundle(current.source, self.settings.registry_uri)))
                previous, self.version = self.version, current.version
            except Exception as err:  # anything a broken bundle, its kept items or an unreachable registry raises
                raise self._failed(champion_version, err) from err
            self.failure = None
        self.metrics.reloads.inc()
        was = f"was v{previous}" if previous is not None else "the first load"
        logger.info("serving champion v%s of %s (%s)", current.version, self.settings.model_name, was)
        return True

    def _failed(self, version: str | None, err: Exception) -> ReloadError:
        what = f"champion v{version} of {self.settings.model_name}" if version else "the registry"
        failure = ReloadFailure(version, f"{what} cannot be loaded: {type(err).__name__}: {err}")
        self.metrics.reload_failures.inc()
        if failure != self.failure:  # a new problem: say it once (its traceback at DEBUG)
            serving = f"still serving v{self.version}" if self.version else "no model loaded"
            logger.error("%s; %s", failure.error, serving)
            logger.debug("reload failure", exc_info=err)
        self.failure = failure
        return ReloadError(failure.error)

    async def poll(self, interval_s: float) -> None:
        """Check every `interval_s` seconds until cancelled; a failed check is recorded and retried."""
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(ReloadError):  # recorded by `check`
                await asyncio.to_thread(self.check)
