"""A small HTTP client for the zerotune service (standard library only: it starts fast anywhere)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class ServiceError(Exception):
    """The service answered with an error status (``status``, ``detail``) or could not be reached (status 0)."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status, self.detail = status, detail
        super().__init__(describe(status, detail))


def describe(status: int, detail: Any) -> str:
    """One line for an error answer: a 422's field, value and rule, or the service's message."""
    if status == 422 and isinstance(detail, list) and detail and isinstance(detail[0], dict):
        p = detail[0]
        return f"{p.get('field')}={p.get('value')!r}: {p.get('rule')}"
    if status == 0:
        return f"service unreachable: {detail}"
    return f"HTTP {status}: {detail}"


class Client:
    """``Client(url, token).request("POST", "/v1/trials", body)`` → ``(status, headers, json)``."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, dict(resp.headers), _json(resp.read())
        except urllib.error.HTTPError as exc:
            payload = _json(exc.read())
            raise ServiceError(exc.code, payload.get("detail", payload) if isinstance(payload, dict) else payload) \
                from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServiceError(0, getattr(exc, "reason", exc)) from None


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return raw.decode("utf-8", "replace")[:500]
