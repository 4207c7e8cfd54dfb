"""`Annotated` dependencies of the routers: the loaded recommender and the history store (tests override them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from serving.history import HistoryStore
from serving.recommender import Recommender


def get_recommender(request: Request) -> Recommender:
    recommender: Recommender | None = getattr(request.app.state, "recommender", None)
    if recommender is None:
        raise HTTPException(status_code=503, detail="no model loaded yet; see /readyz")
    return recommender


def get_history_store(request: Request) -> HistoryStore:
    store: HistoryStore = request.app.state.history_store
    return store


RecommenderDep = Annotated[Recommender, Depends(get_recommender)]
HistoryStoreDep = Annotated[HistoryStore, Depends(get_history_store)]
