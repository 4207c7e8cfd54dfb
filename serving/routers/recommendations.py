"""`POST /v1/recommendations`: top-k for a user (bundle history + online events) or an explicit history, with an
optional text query; `POST /v1/search`: top-k for a text query alone (bundles of a model that reads queries)."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from serving.deps import BatcherDep, HistoryStoreDep, RecommenderDep
from serving.history import Event, HistoryStore, HistoryUnavailableError
from serving.http import StrictJsonRoute
from serving.recommender import RecommendationQuery
from serving.schemas import (
    NO_QUERIES,
    NOT_READY,
    UNPARSEABLE_BODY,
    RecommendationRequest,
    RecommendationResponse,
    ScoredItem,
    SearchRequest,
    SearchResponse,
    Signal,
    error_responses,
)

router = APIRouter(prefix="/v1", tags=["recommendations"], route_class=StrictJsonRoute)


@router.post("/recommendations", responses=error_responses({400: UNPARSEABLE_BODY, 409: NO_QUERIES, 503: NOT_READY}))
async def recommendations(
    body: RecommendationRequest, recommender: RecommenderDep, store: HistoryStoreDep, batcher: BatcherDep
) -> RecommendationResponse:
    """Unknown users and empty histories get the most popular items (`source: popularity`), never an error; with a
    `query` (bundles of a model that reads queries) they get the query's search results instead."""
    if body.query is not None and not recommender.takes_queries:
        raise _takes_no_queries(
            recommender.name, "Fix: omit `query`, or serve a model that reads queries (docs/search.md)"
        )
    domain = -1
    if body.domain is not None:
        try:
            domain = recommender.domain_index(body.domain)
        except ValueError as err:
            raise _invalid("domain", str(err)) from err
    degraded, now, user = False, int(time.time()), 0
    if body.history is not None:
        times = body.timestamps or [now] * len(body.history)
        history, timestamps, unknown = recommender.known_events(
            [Event(i, t) for i, t in zip(body.history, times, strict=True)], now
        )
    else:
        assert body.user_id is not None
        user = recommender.user_idx(body.user_id)  # read by models trained with user tokens, as evaluation reads it
        history, timestamps = recommender.training_history(body.user_id) or ([], [])
        unknown = []
        try:
            online, online_times, unknown = recommender.known_events(await _recent(store, body.user_id), now)
            history, timestamps = history + online, timestamps + online_times
        except HistoryUnavailableError:  # the store logs when it goes down and when it is back
            degraded = True
    history, timestamps = history[-recommender.max_history :], timestamps[-recommender.max_history :]
    query = RecommendationQuery(
        history, body.k, body.exclude_seen, timestamps, request_time=now, domain=domain, text=body.query, user=user
    )
    items = await batcher.recommend(recommender, query)
    signals: list[Signal] = []
    if history:
        signals.append("history")
    if body.query:
        signals.append("query")
    return RecommendationResponse(
        items=[ScoredItem(item_id=r.item_id, title=r.title, score=r.score) for r in items],
        source="model" if signals else "popularity",
        signals=signals or ["popularity"],
        history_length=len(history),
        **RecommendationResponse.unknown(unknown),
        degraded=degraded,
        model_version=recommender.version,
    )


@router.post("/search", responses=error_responses({400: UNPARSEABLE_BODY, 409: NO_QUERIES, 503: NOT_READY}))
async def search(body: SearchRequest, recommender: RecommenderDep, batcher: BatcherDep) -> SearchResponse:
    """The catalogue ranked for a text query alone (bundles of a model that reads queries; others answer 409)."""
    if not recommender.takes_queries:
        raise _takes_no_queries(recommender.name, "Fix: serve a model that reads queries (docs/search.md)")
    items = await batcher.recommend(recommender, RecommendationQuery([], body.k, False, text=body.query))
    return SearchResponse(
        items=[ScoredItem(item_id=r.item_id, title=r.title, score=r.score) for r in items],
        signals=["query"],
        model_version=recommender.version,
    )


def _takes_no_queries(model: str, fix: str) -> HTTPException:
    """A 409: the request is well-formed, but the served model's state cannot answer it."""
    return HTTPException(status_code=409, detail=f"the served {model} model takes no text query. {fix}")


def _invalid(field: str, message: str) -> RequestValidationError:
    """A 422 naming the body field (the app's handler writes `detail` from the message)."""
    return RequestValidationError([{"type": "value_error", "loc": ("body", field), "msg": message}])


async def _recent(store: HistoryStore, user_id: str) -> list[Event]:
    """The user's online events, read off the event loop when the store waits on the network."""
    return await run_in_threadpool(store.recent, user_id) if store.blocking_io else store.recent(user_id)
