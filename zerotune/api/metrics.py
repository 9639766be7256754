"""Prometheus metrics in the text exposition format (no client library: a few counters and gauges).

Counters live in this process; the job and trial gauges are read from the database at scrape time,
so they include the work of every worker on every machine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from zerotune.api.cache import ASGIApp, Receive, Scope, Send


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.outcomes: Counter[str] = Counter()
        """POST /v1/recommendations answers: cached, stored, job_created, job_joined."""

    def render(self, *, cache_hits: int, cache_misses: int, cache_size: int, jobs: Mapping[str, int],
               trials: Mapping[str, int], workers_alive: int, workers_expected: int,
               workers_live: int | None = None) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, doc: str, samples: list[tuple[dict[str, Any], float]]) -> None:
            lines.append(f"# HELP {name} {doc}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

        family("zerotune_http_requests_total", "counter", "HTTP requests by method, route and status.",
               [({"method": m, "route": r, "status": s}, n) for (m, r, s), n in sorted(self.requests.items())])
        family("zerotune_recommendation_requests_total", "counter",
               "POST /v1/recommendations answers by outcome (cached, stored, job_created, job_joined).",
               [({"outcome": k}, n) for k, n in sorted(self.outcomes.items())])
        family("zerotune_cache_hits_total", "counter", "Answers served from the in-memory cache.",
               [({}, cache_hits)])
        family("zerotune_cache_misses_total", "counter", "Cache lookups that found no answer.", [({}, cache_misses)])
        family("zerotune_cache_entries", "gauge", "Recommendations held in the in-memory cache.",
               [({}, cache_size)])
        family("zerotune_jobs", "gauge", "Jobs in the database by state.",
               [({"state": k}, jobs.get(k, 0)) for k in ("queued", "running", "done", "failed", "cancelled")])
        family("zerotune_trials", "gauge", "Trials in the database by status.",
               [({"status": k}, n) for k, n in sorted(trials.items())])
        family("zerotune_embedded_workers", "gauge", "Embedded worker processes alive and expected.",
               [({"kind": "alive"}, workers_alive), ({"kind": "expected"}, workers_expected)])
        if workers_live is not None:
            family("zerotune_workers_live", "gauge",
                   "Worker processes (embedded and remote) heard from within stale_after_s.", [({}, workers_live)])
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class RequestMetrics:
    """Count every HTTP request by method, route template (not the raw path) and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or ("/v1/recommendations" if scope["path"] == "/v1/recommendations"
                                                    else "unmatched")
            self.metrics.requests[(scope["method"], path, status)] += 1
