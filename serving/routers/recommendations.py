"""`POST /v1/recommendations`: top-k for a user (bundle history + online events) or an explicit history."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Request

from serving.deps import HistoryStoreDep, RecommenderDep
from serving.history import HistoryUnavailableError
from serving.schemas import RecommendationRequest, RecommendationResponse, ScoredItem

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["recommendations"])


@router.post("/recommendations")
def recommendations(
    body: RecommendationRequest, request: Request, recommender: RecommenderDep, store: HistoryStoreDep
) -> RecommendationResponse:
    """Unknown users and empty histories get the most popular items (`source: popularity`), never an error."""
    if body.domain is not None:
        raise HTTPException(
            status_code=422, detail=f"domain {body.domain!r}: this bundle serves a single domain; omit `domain`"
        )
    degraded = False
    if body.history is not None:
        history, unknown = recommender.item_idx(body.history)
    else:
        assert body.user_id is not None
        history, unknown = recommender.training_history(body.user_id) or [], []
        try:
            online, unknown = recommender.item_idx(store.recent(body.user_id))
            history += online
        except HistoryUnavailableError as err:
            logger.warning("serving without online events: %s", err)
            degraded = True
    history = history[-recommender.max_history :]
    with request.app.state.metrics.model_call.time():
        items = recommender.recommend(history, body.k, body.exclude_seen)
    return RecommendationResponse(
        items=[ScoredItem(item_id=r.item_id, title=r.title, score=r.score) for r in items],
        source="model" if history else "popularity",
        history_length=len(history),
        unknown_items=unknown,
        degraded=degraded,
        model_version=recommender.version,
    )
