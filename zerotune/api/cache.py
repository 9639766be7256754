"""The answer cache: a stored recommendation, serialized once, served by a dictionary lookup.

``AnswerCache`` maps a request key (the hash of the normalized request) to the JSON bytes of its
recommendation; it is filled on the first database hit and when a job finishes. A prologue storm
sends the *same bytes* hundreds of times, so ``FastAnswer`` (an ASGI middleware) also remembers
which raw bodies the route has validated and answers a repeat before routing, validation or
normalization: one lookup on the body, one on the key — the stored answer (200), or, while the
request's job runs and the client does not ``?wait``, that job (202). Anything else — a new body, a
key with neither — goes down the normal route. The token is checked before this middleware, by
``api.guard.BodyGuard``: a write without it never reaches the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from zerotune.api.settings import MAX_WAIT_S

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/v1/recommendations"
MAX_BODY = 8192  # only small bodies are remembered; a prologue's body is ~100 bytes
MAX_BODIES_BYTES = 4 * 2**20
"""All remembered bodies together (whitespace variants of one request are each a body): oldest dropped first."""


class AnswerCache:
    """Request key → serialized recommendation, least recently stored evicted first; raw body → key.

    Used from the event loop thread only (no locks).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.answers: OrderedDict[str, bytes] = OrderedDict()
        self.bodies: dict[bytes, str] = {}
        self.bodies_bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        answer = self.answers.get(key)
        if answer is None:
            self.misses += 1
        else:
            self.hits += 1
        return answer

    def put(self, key: str, answer: bytes) -> None:
        self.answers[key] = answer
        self.answers.move_to_end(key)
        while len(self.answers) > self.size:
            self.answers.popitem(last=False)

    def remember_body(self, body: bytes, key: str) -> None:
        if len(body) <= MAX_BODY and body not in self.bodies:
            self.bodies[body] = key
            self.bodies_bytes += len(body)
            while len(self.bodies) > 4 * self.size or self.bodies_bytes > MAX_BODIES_BYTES:
                self.bodies_bytes -= len(next(iter(self.bodies)))
                self.bodies.pop(next(iter(self.bodies)))

    def key_for_body(self, body: bytes) -> str | None:
        return self.bodies.get(body)


class FastAnswer:
    """Answer ``POST /v1/recommendations`` from memory when the exact body was answered before.

    ``lookup(key, waits)`` gives ``(status, body, headers)`` for a known key, or None to let the
    route answer.
    """

    def __init__(self, app: ASGIApp, cache: AnswerCache,
                 lookup: Callable[[str, bool], tuple[int, bytes, list[tuple[bytes, bytes]]] | None]) -> None:
        self.app, self.cache, self.lookup = app, cache, lookup

    @staticmethod
    def _as_the_route_would_accept(scope: Scope) -> bool:
        """A JSON body and a valid ``?wait`` (or none): anything else goes down the route, which says why."""
        ctype = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if ctype.split(b";")[0].strip().lower() != b"application/json":
            return False
        for value in parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True).get("wait", []):
            try:
                wait = float(value)
            except ValueError:
                return False
            if not 0 <= wait <= MAX_WAIT_S:  # also refuses nan
                return False
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH \
                or not self._as_the_route_would_accept(scope):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        key = self.cache.key_for_body(body)
        known = self.lookup(key, b"wait=" in scope["query_string"]) if key else None
        if known is not None:
            status, answer, headers = known
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(answer)).encode()), *headers]})
            await send({"type": "http.response.body", "body": answer})
            return
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        status = 0

        async def send_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, replay, send_status)
        key = scope.get("state", {}).get("request_key")
        if status in (200, 202) and key:  # the route validated this body: remember its key
            self.cache.remember_body(body, key)
