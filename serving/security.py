"""Who may call what: a bearer token for the admin routes, optional API keys for everything else but the probes.

Credentials are compared in constant time (`hmac.compare_digest`), so response times do not leak how much of a
guess was right. A missing credential is 401 (with `WWW-Authenticate`), a wrong one 403; both are declared in
the OpenAPI schema through FastAPI's security schemes. The admin routes are not mounted at all without a token
(serving.main), so an unconfigured server has no management surface to attack.

With API keys on, `ApiKeyGate` (ASGI middleware) answers a request without a valid key before anything of it is
read or parsed (a malformed body from an anonymous client is 401, not 400) on every path but `OPEN_PATHS` (the
health probes and the metrics a scraper reads) and the admin routes (their own bearer token): the `/v1` routes,
the dashboard and its script, `/docs` and `/openapi.json`. Its refusals wait `refusal_delay_s` before they are
sent (a sleep, no CPU): a client looping without a key, or guessing keys, gets a few answers per connection per
second instead of a thousand, so it cannot crowd out keyed clients; past `MAX_DELAYED_REFUSALS` waiting at once,
refusals go out at once (a flood of connections is the proxy's to rate-limit: docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.schemas import error_responses
from serving.state import state_of

API_KEY_HEADER = "X-API-Key"
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # answered without a key: probes and the scraper
ADMIN_PREFIX = "/v1/admin"  # guarded by the admin token instead
MAX_DELAYED_REFUSALS = 1024  # refusals waiting at once; beyond, a waiting socket costs more than the answer

_bearer = HTTPBearer(auto_error=False, description="the admin token (RECSYS_ADMIN_TOKEN or RECSYS_ADMIN_TOKEN_FILE)")
_api_key = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, description="one of RECSYS_API_KEYS_FILE's keys")

AUTH_ERRORS = error_responses({401: "no credential was sent", 403: "the credential is not valid"})


def _matches(given: str, accepted: frozenset[str] | tuple[str, ...]) -> bool:
    # every accepted key is compared, so the time taken does not say which one came close
    return any([hmac.compare_digest(given.encode(), key.encode()) for key in accepted])


async def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    token = state_of(request).admin_token
    assert token is not None, "the admin routes are mounted only with a token"
    if credentials is None:
        raise HTTPException(
            status_code=401,
            detail="the admin routes need `Authorization: Bearer <token>`. Fix: send the server's admin token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _matches(credentials.credentials, (token,)):
        raise HTTPException(status_code=403, detail="wrong admin token. Fix: send the server's RECSYS_ADMIN_TOKEN")


def api_key_refusal(key: str | None, accepted: frozenset[str]) -> HTTPException | None:
    """Why a request with `key` (None: no header) may not pass, or None when it may (or no key is required)."""
    if not accepted:
        return None
    if key is None:
        return HTTPException(
            status_code=401,
            detail=f"this server needs an API key in the {API_KEY_HEADER} header. Fix: ask its operator for one",
            headers={"WWW-Authenticate": API_KEY_HEADER},
        )
    if not _matches(key, accepted):
        return HTTPException(status_code=403, detail=f"the {API_KEY_HEADER} is not a key of this server")
    return None


async def require_api_key(request: Request, key: Annotated[str | None, Depends(_api_key)]) -> None:
    """The `/v1` routes' dependency: what declares the key in the OpenAPI schema (`ApiKeyGate` has already
    refused a request without one)."""
    refusal = api_key_refusal(key, state_of(request).api_keys)
    if refusal is not None:
        raise refusal


class ApiKeyGate:
    """Refuse a request without a valid API key before it is read (module docstring); nothing when no keys are set."""

    def __init__(self, app: ASGIApp, api_keys: frozenset[str], refusal_delay_s: float) -> None:
        self.app, self.api_keys, self.refusal_delay_s = app, api_keys, refusal_delay_s
        self.delayed = 0  # refusals now waiting (one event loop: no lock needed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(ADMIN_PREFIX):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(API_KEY_HEADER.lower().encode())
        key = None if header is None else header.decode("latin-1")
        refusal = api_key_refusal(key, self.api_keys)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if self.refusal_delay_s and self.delayed < MAX_DELAYED_REFUSALS:
            self.delayed += 1
            try:
                await asyncio.sleep(self.refusal_delay_s)
            finally:
                self.delayed -= 1
        response = JSONResponse({"detail": refusal.detail}, refusal.status_code, headers=refusal.headers)
        await response(scope, receive, send)


AdminOnly = Depends(require_admin)
ApiKeyRequired = Depends(require_api_key)
