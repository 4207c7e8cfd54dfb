"""`POST /v1/events`: append what a user just did to the online history store (no retraining needed)."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException

from serving.deps import HistoryStoreDep, RecommenderDep
from serving.history import Event, HistoryUnavailableError
from serving.http import StrictJsonRoute
from serving.schemas import NOT_READY, UNPARSEABLE_BODY, EventsRequest, EventsResponse, error_responses

router = APIRouter(prefix="/v1", tags=["events"], route_class=StrictJsonRoute)


@router.post(
    "/events",
    responses=error_responses({400: UNPARSEABLE_BODY, 503: f"{NOT_READY}, or the online history store is down"}),
)
def events(body: EventsRequest, recommender: RecommenderDep, store: HistoryStoreDep) -> EventsResponse:
    """Known items are stored (oldest first) with their time (now when not given); ids outside the catalog are
    named in `unknown_items` (the first few) and counted in `unknown_count`."""
    known, unknown = recommender.item_idx(body.item_ids)
    unknown_ids = set(unknown)
    times = body.timestamps or [int(time.time())] * len(body.item_ids)
    kept = [Event(i, t) for i, t in zip(body.item_ids, times, strict=True) if i not in unknown_ids]
    if kept:
        try:
            store.append(body.user_id, kept)
        except HistoryUnavailableError as err:
            raise HTTPException(status_code=503, detail=f"events not stored, retry later: {err}") from err
    return EventsResponse(user_id=body.user_id, accepted=len(known), **EventsResponse.unknown(unknown))
