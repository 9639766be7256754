"""A Slurm job prologue storm against a running ``zerotune serve``: many nodes ask for one config at once.

Phase 1 (stored answer): make sure one recommendation is stored, then send ``--requests`` identical
POSTs from ``--clients`` concurrent keep-alive connections; print throughput, p50/p99/max latency
and errors (anything but a 200). Phase 2 (new request): the same storm for a request never seen
before; every answer must name the same job, and that request must get exactly one study.

    zerotune serve --port 8000 &                       # or any running service
    python bench/prologue_storm.py --url http://127.0.0.1:8000

Goal on a 2-core machine with this load generator beside the service: zero errors, >= 2,000
requests/s in phase 1, one study in phase 2. The load generator is raw asyncio HTTP/1.1 (uvloop
when installed) so that it measures the service rather than a client library.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Storm:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    elapsed: float = 0.0


async def _client(host: str, port: int, request: bytes, left: list[int], storm: Storm, keep: bool) -> None:
    reader = writer = None
    while left[0] > 0:
        left[0] -= 1
        start = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            assert reader is not None
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            status = int(lines[0].split()[1])
            headers = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
            length = int(headers.get(b"content-length", b"0"))
            body = await reader.readexactly(length)
            if headers.get(b"connection", b"").strip().lower() == b"close":
                writer.close()
                writer = None
        except Exception as exc:  # a refused or dropped connection is an error, not a crash of the bench
            storm.errors.append(f"{type(exc).__name__}: {exc}")
            writer = None
            continue
        storm.latencies.append(time.perf_counter() - start)
        storm.statuses[status] = storm.statuses.get(status, 0) + 1
        if status != 200 and status != 202:
            storm.errors.append(f"HTTP {status}: {body[:200]!r}")
        if keep:
            storm.bodies.append(body)
    if writer is not None:
        writer.close()


async def storm(url: str, body: dict, requests: int, clients: int, token: str | None, keep: bool = False) -> Storm:
    parts = urlsplit(url)
    data = json.dumps(body).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = (f"POST /v1/recommendations HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
               f"{auth}Content-Length: {len(data)}\r\n\r\n").encode() + data
    result, left = Storm(), [requests]
    start = time.perf_counter()
    await asyncio.gather(*(_client(parts.hostname or "127.0.0.1", parts.port or 80, request, left, result, keep)
                           for _ in range(clients)))
    result.elapsed = time.perf_counter() - start
    return result


def _call(url: str, method: str, path: str, body: dict | None, token: str | None, timeout: float) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def report(name: str, s: Storm) -> dict:
    lat = sorted(s.latencies)
    pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: float("nan"))
    row = {"phase": name, "requests": len(lat) + len(s.errors) - sum(1 for e in s.errors if e.startswith("HTTP")),
           "seconds": round(s.elapsed, 3), "requests_per_s": round(len(lat) / s.elapsed, 1) if s.elapsed else 0,
           "p50_ms": round(pick(0.50), 2), "p99_ms": round(pick(0.99), 2), "max_ms": round(pick(1.0), 2),
           "errors": len(s.errors), "statuses": s.statuses}
    print(f"{name:<16} {row['requests']:>6} requests in {row['seconds']:6.2f} s: {row['requests_per_s']:8.0f} req/s, "
          f"p50 {row['p50_ms']:7.2f} ms, p99 {row['p99_ms']:7.2f} ms, max {row['max_ms']:7.2f} ms, "
          f"errors {row['errors']}, statuses {s.statuses}")
    for error in sorted(set(s.errors))[:5]:
        print(f"    {error}")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--token", default=None, help="bearer token when the service has ZEROTUNE_TOKEN set")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=500)
    p.add_argument("--model", default="gpt-neox-20b")
    p.add_argument("--cluster", default="frontier:48")
    p.add_argument("--trials", type=int, default=40, help="budget.trials of the requests (model executor)")
    p.add_argument("--rounds", type=int, default=3, help="phase 1 storms; the best is the headline")
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = p.parse_args(argv)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # plain asyncio still works, a bit slower
        run = asyncio.run
    url = args.url.rstrip("/")
    body = {"model": args.model, "cluster": args.cluster, "executor": "model", "budget": {"trials": args.trials}}
    status, _ = _call(url, "POST", "/v1/recommendations?wait=600", body, args.token, timeout=660)
    if status != 200:
        print(f"prologue_storm: no recommendation stored within 600 s (HTTP {status})", file=sys.stderr)
        return 1
    rows = [report(f"stored answer #{i + 1}", run(storm(url, body, args.requests, args.clients, args.token)))
            for i in range(args.rounds)]
    nodes = random.randint(100, 100_000)  # a request this service has not seen
    fresh = {**body, "cluster": f"{args.cluster.split(':')[0]}:{nodes}"}
    s = run(storm(url, fresh, args.requests, args.clients, args.token, keep=True))
    row = report("new request", s)
    jobs = {json.loads(b)["id"] for b in s.bodies if b.startswith(b'{"id"') and b'"state"' in b}
    answers = {json.loads(b)["id"] for b in s.bodies if b'"exports"' in b}
    job_ids = sorted(jobs)
    studies = None
    if len(job_ids) == 1:
        _, job = _call(url, "GET", f"/v1/jobs/{job_ids[0]}", None, None, timeout=30)
        deadline = time.monotonic() + 600
        while job["state"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
            _, job = _call(url, "GET", f"/v1/jobs/{job_ids[0]}", None, None, timeout=30)
        _, page = _call(url, "GET", f"/v1/studies?request_id={job['request_id']}", None, None, timeout=30)
        studies = page["count"]
        print(f"new request: {len(job_ids)} job ({job['state']}), {studies} study, {len(answers)} distinct "
              f"answer(s) returned during the storm")
    else:
        print(f"new request: {len(job_ids)} jobs: {job_ids[:10]}")
    best = max(rows, key=lambda r: r["requests_per_s"])
    ok = best["errors"] == 0 and row["errors"] == 0 and len(job_ids) == 1 and studies == 1
    verdict = "ok" if ok and best["requests_per_s"] >= 2000 else "below goal"
    print(f"verdict: {verdict} (best stored-answer storm {best['requests_per_s']:.0f} req/s; goal >= 2000, "
          f"0 errors, 1 study)")
    if args.json:
        print(json.dumps({"stored": rows, "new": {**row, "jobs": len(job_ids), "studies": studies}}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
