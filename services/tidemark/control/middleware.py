"""Two small ASGI middlewares Starlette does not ship: a request body cap and an access log
that records one line (and one histogram sample) per request with its duration."""

from __future__ import annotations

import logging
import time

from fastapi import HTTPException
from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("tidemark.control.access")


class BodySizeLimit:
    """413 for a body over ``max_bytes``: up front from Content-Length, and while streaming
    for chunked bodies (the HTTPException is rendered by the app's own handlers)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(send)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, f"request body larger than {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)

    async def _reject(self, send: Send) -> None:
        body = ('{"detail":"request body larger than %d bytes"}' % self.max_bytes).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class AccessLog:
    def __init__(self, app: ASGIApp, histogram: Histogram):
        self.app, self.histogram = app, histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.histogram.labels(scope["method"], route, str(status)).observe(elapsed)
            client = scope.get("client")
            access_log.info("%s %s %s %d %.1fms", client[0] if client else "-", scope["method"], scope["path"],
                            status, elapsed * 1000)
