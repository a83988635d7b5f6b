"""The service's front door, a pure ASGI middleware: authentication first, then a bounded body.

FastAPI reads a request's body before it runs the route's dependencies, so an auth dependency or a
`Content-Length` check alone lets a caller without a key make the server read (and hold) any body
it sends, chunked ones included. `RequestGuard` runs before the app:

1. every path but the public ones (`PUBLIC_PATHS`: liveness and the API docs) needs
   `Authorization: Bearer <key>` when a key is configured; a request without it (or with a wrong
   one) gets 401 before a single body byte is read;
2. a declared `Content-Length` over `max_body` gets 413 at once;
3. the body is then read as it streams (Content-Length or chunked) and refused with 413 as soon as
   it passes `max_body`, so at most `max_body` bytes plus one received chunk are ever held;
4. the app gets the body (at most `max_body` bytes) replayed as one message.

The connection of a refused request is closed by the server (its unread body makes it unusable).
A route that takes larger bodies (appends) gets its own limit by path (`path_limits`, `allow_body`).
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import re
from typing import Any, Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: paths served without a key (liveness and the OpenAPI docs)
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"})


class RequestGuard:
    """Bearer-token check before any body is read, and a streamed body limit (see the module doc)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body: int,
                 public_paths: frozenset[str] = PUBLIC_PATHS, path_limits: Sequence[tuple[str, int]] = ()) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.public_paths = public_paths
        self.path_limits = [(re.compile(pattern), limit) for pattern, limit in path_limits]

    def limit_for(self, path: str) -> int:
        """The body limit of a path: that of the first `path_limits` pattern it matches, else `max_body`."""
        return next((limit for rx, limit in self.path_limits if rx.fullmatch(path)), self.max_body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.authorized(scope["path"], headers):
            await _reply(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
            return
        max_body = self.limit_for(scope["path"])
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body:
            await _reply(send, 413, f"request body over {max_body} bytes")
            return
        body: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return                                  # the client left: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                await _reply(send, 413, f"request body over {max_body} bytes")
                return
            body.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(body), receive), send)

    def authorized(self, path: str, headers: Headers) -> bool:
        """True when no key is configured, the path is public, or the bearer token matches."""
        if self.key is None or path in self.public_paths:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key)


def allow_body(app: Any, path_pattern: str, max_body: int) -> None:
    """Give the paths of a FastAPI / Starlette `app` matching `path_pattern` (a regex) their own body
    limit in its `RequestGuard` (a write route taking larger bodies than the queries); call it before
    the app serves its first request (the middleware is built then)."""
    for m in app.user_middleware:
        if m.cls is RequestGuard:
            m.kwargs["path_limits"] = (*m.kwargs.get("path_limits", ()), (path_pattern, max_body))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields the buffered body once, then defers to the server (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _reply(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": payload})


def open_without_key(host: str, keyed: bool) -> str | None:
    """A warning when a server would bind `host` beyond loopback with no API key (`keyed` false):
    every user's memory, and the routes that write and forget it, open to anyone who reaches the port."""
    if keyed:
        return None
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host.lower() == "localhost"
    if loopback:
        return None
    return (f"serving on {host} without MNEMO_API_KEY: anyone who reaches the port reads, writes and "
            "forgets every user's memory; set MNEMO_API_KEY or bind 127.0.0.1")
