"""`Annotated` dependencies of the routers: the loaded recommender, the history store and the micro-batcher.

They are `async def` although they only read `app.state`: FastAPI runs a plain `def` dependency in its
thread pool, a thread hop per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from serving.batcher import MicroBatcher
from serving.history import HistoryStore
from serving.recommender import Recommender


async def get_recommender(request: Request) -> Recommender:
    recommender: Recommender | None = getattr(request.app.state, "recommender", None)
    if recommender is None:
        raise HTTPException(status_code=503, detail="no model loaded yet; see /readyz")
    return recommender


async def get_history_store(request: Request) -> HistoryStore:
    store: HistoryStore = request.app.state.history_store
    return store


async def get_batcher(request: Request) -> MicroBatcher:
    batcher: MicroBatcher = request.app.state.batcher
    return batcher


RecommenderDep = Annotated[Recommender, Depends(get_recommender)]
HistoryStoreDep = Annotated[HistoryStore, Depends(get_history_store)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
