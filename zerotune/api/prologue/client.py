"""A small HTTP client for the zerotune service (standard library only: it starts fast anywhere).

``Client(url, token).request(method, path, body)`` → ``(status, headers, json)``; an error answer
or a failure to talk to the service raises :class:`ServiceError`.

Two timeouts bound every attempt: ``connect_timeout`` (the TCP/TLS connection) and ``timeout``
(waiting for the answer, per socket read). A client built with ``deadline`` (a
``time.monotonic()`` instant) and ``retry`` (a :class:`Retry`) also retries connection errors,
timeouts, 5xx, 408, 425 and 429 with jittered exponential backoff (honouring ``Retry-After``)
until the deadline, and never lets an attempt or a pause run past it. ``POST /v1/recommendations``
is safe to retry: the service folds equivalent requests into one job.

The client talks to the service directly (``http_proxy`` and friends are not used): the service is
expected inside the cluster's network, where a proxy for the outside world would only get in the way.
"""

from __future__ import annotations

import http.client
import json
import random
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

RETRY_STATUSES = frozenset({408, 425, 429})
"""4xx answers worth another try (every 5xx is too)."""


LAST_ATTEMPT_S = 0.1
"""A retry is made only when at least this long is left before the deadline."""


class ServiceError(Exception):
    """The service answered with an error status (``status``, ``detail``) or could not be reached (status 0).

    ``kind`` says which: ``"http"`` (an error status), ``"unreachable"`` (no connection, or one that
    broke) or ``"timeout"`` (no connection or no answer in time).
    """

    def __init__(self, status: int, detail: Any, kind: str | None = None, headers: dict[str, str] | None = None,
                 ) -> None:
        self.status, self.detail, self.headers = status, detail, headers or {}
        self.kind = kind or ("http" if status else "unreachable")
        super().__init__(describe(status, detail, self.kind))

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed: no connection, a timeout, 5xx, 408, 425 or 429."""
        return self.kind != "http" or self.status >= 500 or self.status in RETRY_STATUSES


def describe(status: int, detail: Any, kind: str = "") -> str:
    """One line for an error answer: a 422's field, value and rule, or the service's message."""
    if status == 422 and isinstance(detail, list) and detail and isinstance(detail[0], dict):
        p = detail[0]
        return f"{p.get('field')}={p.get('value')!r}: {p.get('rule')}"
    if status == 0:
        return f"no answer in time: {detail}" if kind == "timeout" else f"service unreachable: {detail}"
    return f"HTTP {status}: {detail}"


class Retry:
    """Jittered exponential backoff: pause ``n`` (from 0) lasts between d/2 and d, d = min(cap, base x 2^n)."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 2.0, rng: Callable[[], float] = random.random) -> None:
        self.base_s, self.cap_s, self.rng = base_s, cap_s, rng

    def delay(self, attempt: int) -> float:
        d = min(self.cap_s, self.base_s * 2.0 ** min(attempt, 30))
        return d / 2 + self.rng() * d / 2


class Client:
    """``Client(url, token).request("POST", "/v1/trials", body)`` → ``(status, headers, json)``.

    Args:
        url: the service, ``http://host:port`` (``https://`` too; a path prefix is kept).
        token: sent as ``Authorization: Bearer``.
        timeout: seconds to wait for an answer (each socket read).
        connect_timeout: seconds to wait for a connection (default: ``timeout``).
        deadline: a ``time.monotonic()`` instant no attempt, pause or retry may pass.
        retry: retry retryable failures (:attr:`ServiceError.retryable`) until the deadline.
        sleep: ``time.sleep`` (tests may pass another).
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0, *,
                 connect_timeout: float | None = None, deadline: float | None = None, retry: Retry | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.deadline, self.retry, self.sleep = deadline, retry, sleep
        self.attempts = 0  # every attempt made, retries included
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"service URL {url!r}: must look like http://host:port")
        self._scheme, self._host, self._port, self._prefix = parts.scheme, parts.hostname, parts.port, parts.path

    def remaining(self) -> float:
        """Seconds left before the deadline (infinite without one)."""
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def request(self, method: str, path: str, body: Any = None, *, hold: float = 0.0,
                ) -> tuple[int, dict[str, str], Any]:
        """One call, retried when the client has a ``retry``. ``hold``: seconds the service may hold the
        request before answering (``?wait=``), added to the read timeout."""
        failures = 0
        while True:
            try:
                return self._once(method, path, body, hold)
            except ServiceError as exc:
                if self.retry is None or not exc.retryable:
                    raise
                pause = self.retry.delay(failures)
                if exc.kind == "http" and exc.status in (429, 503):
                    pause = max(pause, _retry_after(exc))
                room = self.remaining() - LAST_ATTEMPT_S
                if room <= 0:  # no time for another attempt: the last failure stands
                    raise
                self.sleep(min(pause, room))
                failures += 1

    def _once(self, method: str, path: str, body: Any, hold: float) -> tuple[int, dict[str, str], Any]:
        left = self.remaining()
        if left <= 0:
            raise ServiceError(0, "the time budget is spent", "timeout")
        headers = {"Accept": "application/json", "User-Agent": "zerotune-client"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=min(self.connect_timeout, left))
        self.attempts += 1
        try:
            try:
                conn.connect()
            except TimeoutError:
                raise ServiceError(0, f"no connection to {self.url} within {min(self.connect_timeout, left):g} s",
                                   "timeout") from None
            read_timeout = min(self.timeout + hold, max(self.remaining(), 0.001))
            assert conn.sock is not None
            conn.sock.settimeout(read_timeout)
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except TimeoutError:
                raise ServiceError(0, f"{method} {path}: no answer within {read_timeout:g} s", "timeout") from None
            status, answer = resp.status, dict(resp.getheaders())
        except (OSError, http.client.HTTPException) as exc:
            raise ServiceError(0, str(exc) or type(exc).__name__, "unreachable") from None
        finally:
            conn.close()
        payload = _json(raw)
        if status >= 400:
            raise ServiceError(status, payload.get("detail", payload) if isinstance(payload, dict) else payload,
                               headers=answer)
        return status, answer, payload


def _retry_after(exc: ServiceError) -> float:
    """The ``Retry-After`` seconds of an answer (0 when absent or a date)."""
    value = next((v for k, v in exc.headers.items() if k.lower() == "retry-after"), "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return 0.0


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")[:500]
