"""What the control and index APIs share: the bearer-token check and the one-line message
a request validation error is answered with."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException


def bearer_check(api_token: str | None, env_var: str) -> Callable[..., Awaitable[None]]:
    """A dependency that answers 401 unless the request carries ``api_token`` (compared in
    constant time); ``None`` (``--insecure-dev``) lets every request in. It is async so that
    a refused request never takes one of the worker threads the blocking handlers need."""
    bearer = HTTPBearer(auto_error=False, description=env_var)

    async def authorize(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if api_token is None:
            return
        given = creds.credentials.encode() if creds is not None else b""
        if creds is None or not secrets.compare_digest(given, api_token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    return authorize


def validation_detail(errors: Iterable[dict[str, Any]]) -> str:
    """``field.path: message; ...``: every problem pydantic found, each with where it is."""
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors]
    return "; ".join(parts) or "invalid request"
