"""HTTP-level guards every route shares: a body-size limit, strict JSON, and error bodies that stay small.

- `BodySizeLimit` (ASGI middleware) answers 413 before a body larger than `max_body_bytes` is read: at once from
  its Content-Length, or as soon as a chunked body passes the limit.
- `StrictJsonRoute` answers 415 for a body sent without `Content-Type: application/json` (FastAPI would read a form's
  body, `curl -d`'s, as no object: a 422 "Input should be a valid dictionary" that says nothing of the header), and
  parses bodies with pydantic's JSON parser, which refuses what is not Unicode text (a lone surrogate such as
  "\\ud800" would pass `json.loads` and fail later, when the string is encoded).
- `validation_error_response` turns FastAPI's validation list into a 400 for an unparseable body and a 422 that
  names each field and never echoes the input back (a 1 MB id would otherwise come back in the error).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.schemas import ErrorResponse

MAX_ERRORS = 20  # a list of 1,000 bad ids gets the first few errors, not 1,000
JSON_TYPE = "application/json"
NOT_JSON = f"the body was not sent as JSON (Content-Type: {JSON_TYPE})"


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(send)
            return
        received, refused = 0, False

        async def counted_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes and not refused:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}  # the app stops reading; its own answer is dropped below
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)

    async def _refuse(self, send: Send) -> None:
        detail = f"the request body is larger than {self.max_body_bytes} bytes. Fix: send a smaller body"
        await JSONResponse({"detail": detail}, status_code=413)({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body)
            except ValueError as err:
                text = body.decode(errors="replace")
                raise json.JSONDecodeError(f"{err} (JSON text must be valid Unicode)", text, 0) from err
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose body (when it takes one) is JSON: sent with any other content type, or none (`curl -d` sends a
    form's), it is a 415 saying which header to send, before the body is read; parsed strictly (module docstring)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if self.body_field is not None:
            self.responses = {**self.responses, 415: {"model": ErrorResponse, "description": NOT_JSON}}

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict_handler(request: Request) -> Response:
            given = request.headers.get("content-type")
            if takes_body and not _is_json(given):
                return JSONResponse({"detail": _not_json(given)}, status_code=415)
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict_handler


def _is_json(content_type: str | None) -> bool:
    """`application/json`, or another JSON type (`application/problem+json`), with any parameters."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == JSON_TYPE or (media.startswith("application/") and media.endswith("+json"))


def _not_json(content_type: str | None) -> str:
    given = "none" if content_type is None else repr(content_type[:100])
    return (
        f"the body must be JSON sent with `Content-Type: {JSON_TYPE}` (this request's content type: {given}). Fix: "
        f"send that header, e.g. curl -H 'Content-Type: {JSON_TYPE}' -d '{{...}}' URL"
    )


async def validation_error_response(request: Request, exc: Exception) -> JSONResponse:
    """400 for a body that is not JSON (what was wrong, where); 422 listing each invalid field (type, loc, msg),
    without the input."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    unparseable = [e for e in errors if e["type"] == "json_invalid"]
    if unparseable:
        reason = unparseable[0].get("ctx", {}).get("error", "not JSON")
        return JSONResponse({"detail": f"the body is not valid JSON: {reason}. Fix: send a JSON object"}, 400)
    detail = [{"type": e["type"], "loc": list(e["loc"]), "msg": _short(e["msg"])} for e in errors[:MAX_ERRORS]]
    return JSONResponse({"detail": detail}, status_code=422)


def _short(message: str, limit: int = 300) -> str:
    """Our own validators quote the value they refuse; a message stays readable, not a copy of the input."""
    return message if len(message) <= limit else message[:limit] + "…"
