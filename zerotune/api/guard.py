"""The first thing a request meets: the token of a write and the size of its body, checked before
any of the body is read or parsed (FastAPI reads and parses a body before it runs dependencies, so
``require_token`` alone would let an unauthenticated client make the server hold a body of any size).

- a write (POST, PUT, PATCH, DELETE) without the configured token: 401 at once, the body unread;
- a body over ``max_body_mb``: 413, from its ``Content-Length`` when given, else as soon as the
  streamed body passes the limit; what was read is dropped.

``require_token`` stays on every write route as well: the guard is the early answer, not the only one.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNAUTHORIZED = "this write needs 'Authorization: Bearer <token>' with the service's ZEROTUNE_TOKEN"
"""The 401's detail, here and from ``api.deps.require_token``."""


class BodyGuard:
    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.authorization = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["method"] in WRITES and self.authorization is not None and not hmac.compare_digest(
                headers.get(b"authorization", b""), self.authorization):
            await _answer(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _answer(send, 413, self._too_large(int(declared)))
            return
        received, refused = 0, False

        async def counted() -> MutableMapping[str, Any]:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    refused = True
                    return {"type": "http.disconnect"}  # the app stops reading; we answer below
            return message

        started = False

        async def tracked(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if refused:
                return  # the app's reaction to the cut-off body is replaced by the 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception:
            if not refused:
                raise  # the cut-off body's own error (a disconnect) is not the app's failure
        if refused and not started:
            await _answer(send, 413, self._too_large(received))

    def _too_large(self, size: int) -> str:
        return (f"request body of {size} bytes is over the service's limit of {self.max_body_bytes} bytes "
                f"(ZEROTUNE_MAX_BODY_MB)")


async def _answer(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
