"""ASGI middleware: refuse oversized bodies (413) before any parsing, and count every request in the metrics."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import ServerMetrics

#: the request body as read here, kept in the ASGI scope so an error handler can point into it (invalid JSON)
BODY_SCOPE_KEY = "selfrag.body"


class BodyLimitAndMetrics:
    """Reads the body up to ``limit`` bytes (413 past it), replays it to the app, and records status and latency.

    The metrics label is the route's template (``/v1/chat/completions``, ``/openapi.json``, ``/static`` for every
    file of the page; a 413 or a 405 counts under the route its path names) or ``unmatched``, so random paths cannot
    blow up the label set.
    """

    def __init__(self, app: ASGIApp, limit: int, metrics: ServerMetrics) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500
        before = dict(scope)  # the router rewrites scope for a mount (root_path): match on the request as it came

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            body = await self._read_body(scope, receive)
            if body is None:
                await _too_large(send_and_record, self.limit)
                return
            scope[BODY_SCOPE_KEY] = body
            await self.app(scope, _replay(body, receive), send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", None) or _route_of(before)
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.monotonic() - started)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it is (or says it is) larger than the limit."""
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app sees an empty body and then the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _route_of(scope: Scope) -> str:
    """The template of the application's route that ``scope``'s path names (any method), or ``unmatched``."""
    for route in getattr(scope.get("app"), "routes", ()):
        match, _ = route.matches({**scope, "method": "GET" if scope.get("method") == "HEAD" else scope.get("method")})
        if match != Match.NONE:
            return str(getattr(route, "path", "unmatched"))
    return "unmatched"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _too_large(send: Send, limit: int) -> None:
    payload: dict[str, Any] = {"error": {
        "message": f"the request body is larger than max_request_bytes={limit}; send a shorter request",
        "type": "invalid_request_error", "param": "body", "code": "request_too_large",
    }}
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
