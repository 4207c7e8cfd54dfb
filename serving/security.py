"""Who may call what: a bearer token for the admin routes, optional API keys for the public ones.

Credentials are compared in constant time (`hmac.compare_digest`), so response times do not leak how much of a
guess was right. A missing credential is 401 (with `WWW-Authenticate`), a wrong one 403; both are declared in
the OpenAPI schema through FastAPI's security schemes. The admin routes are not mounted at all without a token
(serving.main), so an unconfigured server has no management surface to attack.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from serving.schemas import error_responses

API_KEY_HEADER = "X-API-Key"

_bearer = HTTPBearer(auto_error=False, description="the admin token (RECSYS_ADMIN_TOKEN or RECSYS_ADMIN_TOKEN_FILE)")
_api_key = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, description="one of RECSYS_API_KEYS_FILE's keys")

AUTH_ERRORS = error_responses({401: "no credential was sent", 403: "the credential is not valid"})


def _matches(given: str, accepted: frozenset[str] | tuple[str, ...]) -> bool:
    # every accepted key is compared, so the time taken does not say which one came close
    return any([hmac.compare_digest(given.encode(), key.encode()) for key in accepted])


async def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    token: str = request.app.state.admin_token
    if credentials is None:
        raise HTTPException(
            status_code=401,
            detail="the admin routes need `Authorization: Bearer <token>`. Fix: send the server's admin token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _matches(credentials.credentials, (token,)):
        raise HTTPException(status_code=403, detail="wrong admin token. Fix: send the server's RECSYS_ADMIN_TOKEN")


async def require_api_key(request: Request, key: Annotated[str | None, Depends(_api_key)]) -> None:
    accepted: frozenset[str] = request.app.state.api_keys
    if not accepted:
        return
    if key is None:
        raise HTTPException(
            status_code=401,
            detail=f"this server needs an API key in the {API_KEY_HEADER} header. Fix: ask its operator for one",
            headers={"WWW-Authenticate": API_KEY_HEADER},
        )
    if not _matches(key, accepted):
        raise HTTPException(status_code=403, detail=f"the {API_KEY_HEADER} is not a key of this server")


AdminOnly = Depends(require_admin)
ApiKeyRequired = Depends(require_api_key)
