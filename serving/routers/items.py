"""`GET /v1/similar-items/{item_id}`: nearest items by the model's item vectors (FAISS index of the bundle, and an exact
index of the items added at run time)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi import Path as PathParam

from serving.deps import RecommenderDep
from serving.schemas import MAX_ID_CHARS, NOT_READY, ScoredItem, SimilarItemsResponse, error_responses

router = APIRouter(prefix="/v1", tags=["items"])


@router.get(
    "/similar-items/{item_id:path}",  # every id an item may have, a "/" in it too (sent as %2F)
    responses=error_responses(
        {
            404: "the item is not in the served catalogue (its trained items and those added at run time)",
            501: "the served model has no item vectors",
            503: NOT_READY,
        }
    ),
)
def similar_items(
    item_id: Annotated[str, PathParam(max_length=MAX_ID_CHARS)],
    recommender: RecommenderDep,
    k: Annotated[int, Query(ge=1, le=100)] = 10,
) -> SimilarItemsResponse:
    known, _ = recommender.item_idx([item_id])
    if not known:
        raise HTTPException(  # the id is not echoed: the client has it
            status_code=404,
            detail="unknown item: not found in the served catalogue (its trained items and those added at run time). "
            "Fix: send an id of the bundle's catalogue, or add the item (POST /v1/admin/items)",
        )
    items = recommender.similar_items(known[0], k)
    if items is None:
        raise HTTPException(status_code=501, detail=f"the served {recommender.name} model has no item vectors")
    return SimilarItemsResponse(
        item_id=item_id,
        items=[ScoredItem(item_id=r.item_id, title=r.title, score=r.score) for r in items],
        model_version=recommender.version,
    )
