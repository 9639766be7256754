"""The service's connections under uvicorn: a deadline on every request head, and a ceiling on open connections.

uvicorn 0.55 has neither. ``timeout_keep_alive`` is armed only once a response has been sent, and any byte received
disarms it, so a client that opens a connection and sends its head one byte at a time holds the connection (and a
file descriptor) for as long as it likes; its HTTP protocols (httptools, h11, zttp) have no timer for a head.
``limit_concurrency`` counts those connections too, and once they are many it answers 503 to everyone, health
probes included. ``h11_max_incomplete_event_size`` bounds a head's size, not its time. So the service runs uvicorn
with its own HTTP protocol, :func:`protocol`: uvicorn's httptools protocol plus two rules.

- **A request head within** ``header_timeout_s`` (``ZEROTUNE_HEADER_TIMEOUT_S``), counted from the connection's
  opening, or from the end of the previous response on a kept-alive connection. A connection that has not sent a
  complete head by then is closed.
- **At most** ``max_connections`` **open connections** (``ZEROTUNE_MAX_CONNECTIONS``; by default the process's
  descriptor limit less :data:`RESERVED_FDS`). The connection that passes the ceiling closes the oldest connection
  that is waiting on its client (no complete head yet, or a body still arriving). A health probe sends its head at
  once, so it is never the one closed, and the process never reaches its descriptor limit, where ``accept()``
  would fail for every client alike.

Both are logged: one warning per :data:`LOG_EVERY_S` with the number of connections closed and why.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("zerotune.api")

RESERVED_FDS = 128
"""Descriptors kept for everything but client connections: the database, the worker pipes, log files, imports."""
LOG_EVERY_S = 10.0
"""A closing is logged at most this often (a slow-client attack closes thousands)."""


def default_max_connections() -> int:
    """The process's open-file limit less :data:`RESERVED_FDS` (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, soft - RESERVED_FDS)


class Closings:
    """Counts of connections closed, by cause, logged at most every :data:`LOG_EVERY_S` seconds."""

    def __init__(self, header_timeout_s: float, max_connections: int) -> None:
        self.header_timeout_s, self.max_connections = header_timeout_s, max_connections
        self.counts = {"slow head": 0, "over the ceiling": 0}
        self.flush: asyncio.TimerHandle | None = None

    def count(self, cause: str, loop: asyncio.AbstractEventLoop) -> None:
        self.counts[cause] += 1
        if self.flush is None:
            self.report()  # the first of a burst at once, the rest every LOG_EVERY_S
            self.flush = loop.call_later(LOG_EVERY_S, self.again, loop)

    def again(self, loop: asyncio.AbstractEventLoop) -> None:
        had = any(self.counts.values())
        self.report()
        # a quiet period ends the burst: the next closing is logged at once
        self.flush = loop.call_later(LOG_EVERY_S, self.again, loop) if had else None

    def report(self) -> None:
        slow, over = self.counts["slow head"], self.counts["over the ceiling"]
        if slow or over:
            log.warning("closed %d connection(s) with no complete request head after %g s (ZEROTUNE_HEADER_TIMEOUT_S) "
                        "and %d waiting on their client to stay under %d open connections (ZEROTUNE_MAX_CONNECTIONS)",
                        slow, self.header_timeout_s, over, self.max_connections)
            self.counts = dict.fromkeys(self.counts, 0)


def protocol(header_timeout_s: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline on each request head and a ceiling on open connections (pass
    it as ``uvicorn.Config(http=...)``)."""
    closings = Closings(header_timeout_s, max_connections)

    class Protocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.head_deadline: asyncio.TimerHandle | None = None
            self.waiting_since: float | None = None  # when it began waiting on its client's head (None: not)
            self.head_at = 0.0  # when its last head was complete

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head()
            if len(self.connections) > max_connections:
                self._close_oldest_waiting()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_received()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._head_received()
            self.head_at = time.monotonic()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self._await_head()  # the next head on this kept-alive connection, within the same time

        # -- the two rules ---------------------------------------------------------------------------------------
        def _await_head(self) -> None:
            self._head_received()
            self.waiting_since = time.monotonic()
            self.head_deadline = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _head_received(self) -> None:
            if self.head_deadline is not None:
                self.head_deadline.cancel()
                self.head_deadline = None
            self.waiting_since = None

        def _head_too_slow(self) -> None:
            self.head_deadline = None
            if not self.transport.is_closing():
                closings.count("slow head", self.loop)
                self.transport.close()

        def waiting_on_client(self) -> float | None:
            """Since when this connection waits on its client (a head, or a body still arriving), or None."""
            if self.waiting_since is not None:
                return self.waiting_since
            cycle = self.cycle
            if cycle is not None and cycle.more_body and not cycle.response_started and not cycle.disconnected:
                return self.head_at
            return None

        def _close_oldest_waiting(self) -> None:
            oldest: tuple[float, Protocol] | None = None
            for conn in self.connections:
                if not isinstance(conn, Protocol) or conn is self or conn.transport.is_closing():
                    continue
                since = conn.waiting_on_client()
                if since is not None and (oldest is None or since < oldest[0]):
                    oldest = (since, conn)
            victim = oldest[1] if oldest is not None else self  # every other one is being answered: refuse this one
            closings.count("over the ceiling", self.loop)
            victim.transport.close()

    return Protocol
