"""Micro-batching: the recommendation requests that arrive while the model is busy share one model call.

One asyncio task drains a queue: it takes every request waiting (up to `max_batch`), scores them in one
`Recommender.recommend_batch` call on a dedicated model thread (the event loop keeps parsing and answering
HTTP meanwhile), then resolves each request's future. There is no waiting timer, so a lone request is
scored at once and batches only form under load, where they raise throughput. Requests hold the
recommender they were parsed against, so a hot swap never mixes two models' item ids in one call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from recsys.inference import SourcedScorer
from serving.metrics import ServingMetrics
from serving.recommender import Recommendation, RecommendationQuery, Recommender

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    recommender: Recommender
    query: RecommendationQuery
    future: asyncio.Future[list[Recommendation]]


class MicroBatcher:
    def __init__(self, max_batch: int, metrics: ServingMetrics) -> None:
        self.max_batch = max_batch
        self._metrics = metrics
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recsys-model")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._drain(), name="recsys-micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._model_thread.shutdown(wait=True)

    async def recommend(self, recommender: Recommender, query: RecommendationQuery) -> list[Recommendation]:
        """The query's top-k, scored together with whatever else is waiting."""
        if self._task is None or self._task.done():
            raise RuntimeError("the micro-batcher is not running: create the app with `create_app` (its lifespan)")
        future: asyncio.Future[list[Recommendation]] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(recommender, query, future))
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [p for p in batch if not p.future.cancelled()]  # clients that hung up
            for recommender in {id(p.recommender): p.recommender for p in batch}.values():
                group = [p for p in batch if p.recommender is recommender]
                start = time.perf_counter()
                try:
                    results = await loop.run_in_executor(
                        self._model_thread, recommender.recommend_batch, [p.query for p in group]
                    )
                except Exception as err:  # one bad call must not stop the batcher: each request gets the error
                    logger.exception("model call failed for a batch of %d requests", len(group))
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(err)
                    continue
                self._metrics.model_call.observe(time.perf_counter() - start)
                self._metrics.batch_size.observe(len(group))
                if isinstance(recommender.model, SourcedScorer):  # read on this task before the next call starts
                    self._metrics.observe_sources(recommender.model.last_source_calls)
                for p, result in zip(group, results, strict=True):
                    if not p.future.done():
                        p.future.set_result(result)
