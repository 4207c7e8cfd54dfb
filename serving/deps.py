"""`Annotated` dependencies of the routers: the app's state, the loaded recommender, the history store and the
micro-batcher (`serving.state`).

They are `async def` although they only read the state: FastAPI runs a plain `def` dependency in its thread pool, a
thread hop per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.batcher import MicroBatcher
from serving.history import HistoryStore
from serving.recommender import Recommender
from serving.state import ServingState, state_of


async def get_state(request: Request) -> ServingState:
    return state_of(request)


async def get_recommender(request: Request) -> Recommender:
    return state_of(request).served()


async def get_history_store(request: Request) -> HistoryStore:
    store = state_of(request).history_store
    assert store is not None, "the lifespan starts the history store before the first request"
    return store


async def get_batcher(request: Request) -> MicroBatcher:
    batcher = state_of(request).batcher
    assert batcher is not None, "the lifespan starts the micro-batcher before the first request"
    return batcher


StateDep = Annotated[ServingState, Depends(get_state)]
RecommenderDep = Annotated[Recommender, Depends(get_recommender)]
HistoryStoreDep = Annotated[HistoryStore, Depends(get_history_store)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
