"""Request bodies are strict JSON, decoded once for every endpoint by this route class.

Python's ``json`` accepts ``NaN``, ``Infinity`` and lone UTF-16 surrogates (``"\\ud800"``),
none of which is JSON text. Let in, they reach code that cannot represent them -- the 422
that echoes the input back cannot encode it, a surrogate cannot be written to Kafka -- and
turned into 500s. Refusing them at decoding keeps every later step (validation, planning,
the registry, error responses) within what JSON can say. Decoding is pydantic's (jiter),
which refuses NaN, Infinity and lone surrogates with a position; a number too large for a
float (``1e999``) still decodes to infinity, so the result is checked to be finite.

A body endpoint called without a JSON content type gets a 415 that says what to send,
rather than pydantic's "Input should be a valid dictionary".
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def decode(body: bytes) -> Any:
    """The body as JSON; ``HTTPException(422)`` saying what is wrong and where."""
    try:
        value = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as err:
        raise HTTPException(422, f"request body is not valid JSON: {err} (JSON has no NaN or Infinity, and "
                                 "its text must be valid Unicode: no lone surrogate escapes)") from None
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise HTTPException(422, "request body is not valid JSON here: a number is too large for a "
                                 "64-bit float") from None
    return value


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = decode(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """Set as the app's ``route_class`` before the routes are declared."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict(request: Request) -> Response:
            if takes_body and not _is_json(request.headers.get("content-type")):
                given = request.headers.get("content-type") or "none"
                raise HTTPException(415, f"send Content-Type: application/json with a JSON body (got {given[:100]!r})")
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
