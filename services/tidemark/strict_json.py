"""Request bodies parsed as strict JSON (RFC 8259), for FastAPI apps.

Python's ``json`` module, which Starlette uses, accepts ``NaN``/``Infinity`` and unpaired
UTF-16 surrogates (``"\\ud800"``). Both then break later, far from the input: a surrogate
echoed in an error message cannot be encoded as UTF-8, a NaN cannot be rendered by a JSON
response, and either ends as a 500. Parsing with pydantic's own parser (jiter), which
refuses both and bounds nesting depth, turns them into a 400 that says where the body
went wrong. Use ``APIRouter(route_class=StrictJSONRoute)`` or
``app.router.route_class = StrictJSONRoute`` before declaring routes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = pydantic_core.from_json(await self.body(), allow_inf_nan=False)
            except ValueError as exc:
                raise HTTPException(400, f"request body is not valid JSON: {exc} "
                                         "(NaN, Infinity and unpaired surrogates are not JSON)") from None
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
