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
"""
from __future__ import annotations

import hmac
import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: paths served without a key (liveness and the OpenAPI docs)
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"})


class RequestGuard:
    """Bearer-token check before any body is read, and a streamed body limit (see the module doc)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body: int,
                 public_paths: frozenset[str] = PUBLIC_PATHS) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.authorized(scope["path"], headers):
            await _reply(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            await _reply(send, 413, f"request body over {self.max_body} bytes")
            return
        body: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return                                  # the client left: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _reply(send, 413, f"request body over {self.max_body} bytes")
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
