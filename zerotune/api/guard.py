"""The first thing a request meets: the token of a write and the size of its body, checked before
any of the body is read or parsed (FastAPI reads and parses a body before it runs dependencies, so
``require_token`` alone would let an unauthenticated client make the server hold a body of any size).

- a write (POST, PUT, PATCH, DELETE) without the configured token: 401 at once, the body unread;
- a body over ``max_body_mb``: 413, from its ``Content-Length`` when given, else as soon as the
  streamed body passes the limit; what was read is dropped;
- the bodies read and parsed at once: ``body_memory_mb`` together (:class:`BodyBudget`; a body counts as its
  ``Content-Length``, one without as ``max_body_mb``). A body that does not fit waits up to ``body_wait_s``
  unread (uvicorn stops reading a connection once 64 KiB of its body wait in memory), then gets 503 with
  ``Retry-After``. A prologue storm's bodies are a few hundred bytes each: thousands fit at once;
- a body that has not arrived whole ``body_timeout_s`` after the service began reading it: 408, and its room
  is given back (a client trickling its body would otherwise hold it).

``require_token`` stays on every write route as well: the guard is the early answer, not the only one.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import deque
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNAUTHORIZED = "this write needs 'Authorization: Bearer <token>' with the service's ZEROTUNE_TOKEN"
"""The 401's detail, here and from ``api.deps.require_token``."""
BUSY = ("the service is reading as many request bodies as it holds in memory at once (ZEROTUNE_BODY_MEMORY_MB); "
        "retry after the seconds in Retry-After")
RETRY_AFTER = b"1"

log = logging.getLogger("zerotune.api")


def bearer(header: bytes) -> bytes | None:
    """The credentials of an ``Authorization: Bearer <token>`` header, or None. The scheme is case-insensitive
    (RFC 9110 section 11.1: ``bearer``, ``BEARER``); whitespace around the token is not part of it."""
    scheme, _, credentials = header.strip().partition(b" ")
    return credentials.strip() if scheme.lower() == b"bearer" and credentials.strip() else None


class BodyBudget:
    """Bytes of request bodies in memory at once: :meth:`acquire` waits (first come, first served) for room."""

    def __init__(self, total: int) -> None:
        self.total = self.free = total
        self.waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.refused = 0

    async def acquire(self, size: int, timeout: float) -> bool:
        """Take ``size`` bytes (at most the whole budget) within ``timeout`` seconds; False when there was no room."""
        if not self.waiters and self.free >= size:
            self.free -= size
            return True
        entry = (size, asyncio.get_running_loop().create_future())
        self.waiters.append(entry)
        try:
            await asyncio.wait({entry[1]}, timeout=timeout)
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self.release(size)  # granted just as this request was cancelled
            else:
                self._forget(entry)
            raise
        if entry[1].done():
            return True
        self._forget(entry)
        return False

    def _forget(self, entry: tuple[int, asyncio.Future[None]]) -> None:
        entry[1].cancel()
        try:
            self.waiters.remove(entry)
        except ValueError:
            pass
        self._grant()  # a large body that gave up may have held back smaller ones behind it

    def release(self, size: int) -> None:
        self.free += size
        self._grant()

    def _grant(self) -> None:
        while self.waiters and self.waiters[0][0] <= self.free:
            size, future = self.waiters.popleft()
            if not future.done():
                self.free -= size
                future.set_result(None)


class BodyGuard:
    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int, body_memory_bytes: int | None = None,
                 body_wait_s: float = 5.0, body_timeout_s: float = 60.0) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.token = token.encode() if token else None
        self.budget = BodyBudget(body_memory_bytes or 2 * max_body_bytes)
        self.body_wait_s, self.body_timeout_s = body_wait_s, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["method"] in WRITES and self.token is not None and not hmac.compare_digest(
                bearer(headers.get(b"authorization", b"")) or b"", self.token):
            await _answer(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _answer(send, 413, self._too_large(int(declared)))
            return
        if scope["method"] not in WRITES or declared == b"0":
            await self._guarded(scope, receive, send)  # no body is read: nothing to hold room for
            return
        size = min(int(declared) if declared is not None and declared.isdigit() else self.max_body_bytes,
                   self.budget.total)
        if not await self.budget.acquire(size, self.body_wait_s):
            self.budget.refused += 1
            await _answer(send, 503, BUSY, [(b"retry-after", RETRY_AFTER), (b"connection", b"close")])
            return
        try:
            await self._guarded(scope, receive, send)
        finally:
            self.budget.release(size)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with the body cut off past ``max_body_bytes`` (413) or past ``body_timeout_s`` (408)."""
        received, refused = 0, 0
        timer: asyncio.TimerHandle | None = None
        waiting: asyncio.Task[Any] | None = None  # the app's task while it waits for the body, for the timer

        def too_slow() -> None:
            nonlocal refused
            refused = 408
            if waiting is not None:
                waiting.cancel()

        async def counted() -> MutableMapping[str, Any]:
            nonlocal received, refused, timer, waiting
            if refused:
                return {"type": "http.disconnect"}
            if timer is None:  # one timer a request (asyncio.timeout or wait_for around each receive cost 4-8x more)
                loop = asyncio.get_running_loop()
                timer = loop.call_at(loop.time() + self.body_timeout_s, too_slow)
            waiting = asyncio.current_task()
            try:
                message = await receive()
            except asyncio.CancelledError:
                if refused == 408 and waiting is not None and waiting.uncancel() == 0:
                    return {"type": "http.disconnect"}  # the app stops reading; we answer below
                raise
            finally:
                waiting = None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    timer.cancel()  # the whole body is in: what the app does next is not timed here
                if received > self.max_body_bytes:
                    refused = 413
                    return {"type": "http.disconnect"}
            return message

        started = False

        async def tracked(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if refused:
                return  # the app's reaction to the cut-off body is replaced by the 413 or 408
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception:
            if not refused:
                raise  # the cut-off body's own error (a disconnect) is not the app's failure
        finally:
            if timer is not None:
                timer.cancel()
        if refused == 413 and not started:
            await _answer(send, 413, self._too_large(received))
        elif refused == 408 and not started:
            log.warning("%s %s: %d bytes of its body in %g s (ZEROTUNE_BODY_TIMEOUT_S); answered 408",
                        scope["method"], scope["path"], received, self.body_timeout_s)
            await _answer(send, 408, f"the request body did not arrive whole within {self.body_timeout_s:g} s "
                          f"({received} bytes came; ZEROTUNE_BODY_TIMEOUT_S)", [(b"connection", b"close")])

    def _too_large(self, size: int) -> str:
        return (f"request body of {size} bytes is over the service's limit of {self.max_body_bytes} bytes "
                f"(ZEROTUNE_MAX_BODY_MB)")


async def _answer(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
