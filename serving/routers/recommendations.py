"""`POST /v1/recommendations`: top-k for a user (bundle history + online events) or an explicit history."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from serving.deps import BatcherDep, HistoryStoreDep, RecommenderDep
from serving.history import Event, HistoryStore, HistoryUnavailableError
from serving.http import StrictJsonRoute
from serving.recommender import RecommendationQuery
from serving.schemas import (
    NOT_READY,
    UNPARSEABLE_BODY,
    RecommendationRequest,
    RecommendationResponse,
    ScoredItem,
    error_responses,
)

router = APIRouter(prefix="/v1", tags=["recommendations"], route_class=StrictJsonRoute)


@router.post("/recommendations", responses=error_responses({400: UNPARSEABLE_BODY, 503: NOT_READY}))
async def recommendations(
    body: RecommendationRequest, recommender: RecommenderDep, store: HistoryStoreDep, batcher: BatcherDep
) -> RecommendationResponse:
    """Unknown users and empty histories get the most popular items (`source: popularity`), never an error."""
    domain = -1
    if body.domain is not None:
        try:
            domain = recommender.domain_index(body.domain)
        except ValueError as err:
            raise RequestValidationError([{"type": "value_error", "loc": ("body", "domain"), "msg": str(err)}]) from err
    degraded, now = False, int(time.time())
    if body.history is not None:
        times = body.timestamps or [now] * len(body.history)
        history, timestamps, unknown = recommender.known_events(
            [Event(i, t) for i, t in zip(body.history, times, strict=True)], now
        )
    else:
        assert body.user_id is not None
        history, timestamps = recommender.training_history(body.user_id) or ([], [])
        unknown = []
        try:
            online, online_times, unknown = recommender.known_events(await _recent(store, body.user_id), now)
            history, timestamps = history + online, timestamps + online_times
        except HistoryUnavailableError:  # the store logs when it goes down and when it is back
            degraded = True
    history, timestamps = history[-recommender.max_history :], timestamps[-recommender.max_history :]
    query = RecommendationQuery(history, body.k, body.exclude_seen, timestamps, request_time=now, domain=domain)
    items = await batcher.recommend(recommender, query)
    return RecommendationResponse(
        items=[ScoredItem(item_id=r.item_id, title=r.title, score=r.score) for r in items],
        source="model" if history else "popularity",
        history_length=len(history),
        unknown_items=unknown,
        degraded=degraded,
        model_version=recommender.version,
    )


async def _recent(store: HistoryStore, user_id: str) -> list[Event]:
    """The user's online events, read off the event loop when the store waits on the network."""
    return await run_in_threadpool(store.recent, user_id) if store.blocking_io else store.recent(user_id)
