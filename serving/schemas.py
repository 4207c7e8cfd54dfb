"""Request and response bodies of the online API, per resource (pydantic; invalid input -> 422 with a message)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from recsys.artifacts.added_items import FIELD_NAME, MAX_FIELDS, MAX_TEXT_CHARS
from recsys.data.schema import MAX_ID_CHARS, MAX_TIMESTAMP

MAX_ECHOED_IDS = 20  # a response names at most this many of the ids a request sent (the rest are counted)
MAX_QUERY_CHARS = 200  # a search box's worth: longer texts are documents, not queries
MAX_ITEMS_PER_ADD = 1_000

# every id a client sends: users and items alike
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
Timestamp = Annotated[int, Field(ge=0, le=MAX_TIMESTAMP, description="unix seconds")]
# a text query: surrounding blanks dropped, then 1..MAX_QUERY_CHARS characters (the 422 names the limit)
QueryText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_QUERY_CHARS)]
Signal = Literal["history", "query", "popularity"]
# an item's text: 1..MAX_TEXT_CHARS characters, not all blank (a pattern, so the spec states it); the limits are
# `recsys.artifacts.added_items.NewItem`'s, which checks the kept file's items too
ItemText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS, pattern=r"\S")]
FieldName = Annotated[str, StringConstraints(pattern=FIELD_NAME)]  # an item column, e.g. llm_category


class _Body(BaseModel):
    # strict: `true` is not a number, "10" is not an int (JSON has the types; a client sending others is wrong)
    model_config = ConfigDict(extra="forbid", strict=True)


# ----------------------------------------------------------------------------------------- recommendations


class RecommendationRequest(_Body):
    """Either a known `user_id` (their bundle history plus their online events) or an explicit `history`."""

    user_id: Identifier | None = None
    history: list[Identifier] | None = Field(None, max_length=1_000, description="item ids, oldest first")
    timestamps: list[Timestamp] | None = Field(
        None,
        max_length=1_000,
        description="unix seconds of the `history` items (same length; time-aware models read them); "
        "omitted = all at the time of the request",
    )
    k: int = Field(10, ge=1, le=100)
    exclude_seen: bool = True
    domain: str | None = Field(
        None,
        max_length=64,
        description="multi-domain bundles: the domain to recommend in (its adapter, its items); default: the "
        "history's. Single-domain bundles reject it",
    )
    query: QueryText | None = Field(
        None,
        description="a text query read beside the history (bundles of a model that reads queries; others reject it)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> RecommendationRequest:
        if (self.user_id is None) == (self.history is None):
            raise ValueError("give exactly one of user_id or history")
        if self.timestamps is not None:
            if self.history is None:
                raise ValueError("timestamps go with an explicit history: omit them with user_id")
            _check_timestamps(self.timestamps, len(self.history), "history")
        return self


class ScoredItem(BaseModel):
    item_id: str
    title: str
    score: float


class _ReportsUnknownItems(BaseModel):
    """The item ids a request sent that are not in the catalog (ignored): the first few named, all counted, so a
    response never grows with its request."""

    unknown_items: list[str] = Field(
        description=f"ids not in the catalog (ignored): the first {MAX_ECHOED_IDS}, unknown_count says how many"
    )
    unknown_count: int = Field(description="how many of the ids sent are not in the catalog")

    @staticmethod
    def unknown(ids: list[str]) -> dict[str, Any]:
        """The two fields for these unknown ids."""
        return {"unknown_items": ids[:MAX_ECHOED_IDS], "unknown_count": len(ids)}


class RecommendationResponse(_ReportsUnknownItems):
    items: list[ScoredItem]
    source: Literal["model", "popularity"] = Field(
        description="popularity: the fallback for an empty history without a query"
    )
    signals: list[Signal] = Field(description="what the ranking read: the history, the query, or popularity alone")
    history_length: int = Field(description="items of history the model read (bundle + online events)")
    degraded: bool = Field(description="the online history store did not answer: bundle history only")
    model_version: str


class SearchRequest(_Body):
    query: QueryText
    k: int = Field(10, ge=1, le=100)


class SearchResponse(BaseModel):
    items: list[ScoredItem]
    signals: list[Signal] = Field(description="what the ranking read: the query alone")
    model_version: str


class SimilarItemsResponse(BaseModel):
    item_id: str
    items: list[ScoredItem]
    model_version: str


# ------------------------------------------------------------------------------------------------- events


class EventsRequest(_Body):
    user_id: Identifier
    item_ids: list[Identifier] = Field(min_length=1, max_length=100, description="items the user just interacted with")
    timestamps: list[Timestamp] | None = Field(
        None, max_length=100, description="unix seconds of the events (same length as item_ids); omitted = now"
    )

    @model_validator(mode="after")
    def _aligned(self) -> EventsRequest:
        if self.timestamps is not None:
            _check_timestamps(self.timestamps, len(self.item_ids), "item_ids")
        return self


def _check_timestamps(timestamps: list[int], expected: int, of: str) -> None:
    if len(timestamps) != expected:
        raise ValueError(f"timestamps has {len(timestamps)} values for {expected} {of}: give one per item")


class EventsResponse(_ReportsUnknownItems):
    user_id: str
    accepted: int


# ------------------------------------------------------------------------------------------------- health


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    model_version: str | None = None
    history_store: str | None = None
    detail: str | None = None
    reload_error: str | None = Field(
        default=None, description="the registry's champion that could not be loaded, and why"
    )


# ------------------------------------------------------------------------------------------------- errors


class ErrorResponse(BaseModel):
    """An error the client can act on: `detail` says what was wrong and how to fix it."""

    detail: str


NOT_READY = "no model loaded yet (see /readyz)"
UNPARSEABLE_BODY = "the body is not parseable JSON"
NO_QUERIES = "the served model takes no text query (serve a model that reads queries: docs/search.md)"
TOO_LARGE = "the body is larger than the server's limit (RECSYS_MAX_BODY_BYTES)"


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` of a route for its error statuses (all with an `ErrorResponse` body)."""
    return {code: {"model": ErrorResponse, "description": text} for code, text in descriptions.items()}


# ----------------------------------------------------------------------------------------- items added at run time


class NewItemBody(_Body):
    item_id: Identifier
    title: ItemText
    fields: dict[FieldName, ItemText] = Field(
        default_factory=dict,
        max_length=MAX_FIELDS,
        json_schema_extra={"additionalProperties": False},  # the spec says what the pattern refuses
        description="other text columns of the item (e.g. llm_category, llm_description): those the served model's "
        "content text is made of are used, the rest ignored",
    )


class AddItemsRequest(_Body):
    items: list[NewItemBody] = Field(
        min_length=1, max_length=MAX_ITEMS_PER_ADD, description="an id given twice counts once, as its last entry"
    )


class AddItemsResponse(BaseModel):
    added: int  # distinct items of this request (new, or replacing an earlier add)
    live: int  # items added at run time that the served model ranks now
    model_version: str
