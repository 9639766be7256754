"""Memory and health of a ``zerotune serve`` under many large request bodies at once, and under slow clients.

Starts its own service (no embedded workers, SQLite in a temporary directory, the checkout it runs from), reads the
service's resident memory (``/proc/PID/status``: ``VmRSS`` before and after, ``VmHWM`` for the peak), then:

1. ``--bodies`` concurrent POSTs of ``--body-mib`` MiB each to ``/v1/recommendations`` (each a 422: a valid
   request with one unknown field holding the bulk), counting the answers by status;
2. ``--slow`` connections that send a request head one byte every ``--drip-s`` seconds for ``--slow-s`` seconds.

Throughout, ``/healthz`` is asked every 0.2 s on a new connection; the worst latency (or the first failure) is
printed. Settings pass through: ``ZEROTUNE_BODY_MEMORY_MB=... python bench/body_pressure.py``.

    python bench/body_pressure.py                              # 30 bodies of 7.9 MiB, 400 slow heads for 25 s
    python bench/body_pressure.py --slow 0 --json              # bodies only, one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_mb(pid: int) -> dict[str, float]:
    """``VmRSS`` (now) and ``VmHWM`` (the peak since the process started) in MB (10**6 bytes)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024 / 1e6
    return out


class Health(threading.Thread):
    """Asks ``/healthz`` every 0.2 s on a new connection; keeps the worst latency and every failure."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.worst, self.asked = url, 0.0, 0
        self.failures: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            start = time.monotonic()
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
                    ok = r.status == 200
            except (OSError, urllib.error.URLError) as exc:
                ok = False
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.asked += 1
            if ok:
                self.worst = max(self.worst, time.monotonic() - start)


def post(port: int, data: bytes, statuses: dict[str, int], lock: threading.Lock) -> None:
    head = (f"POST /v1/recommendations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            s.sendall(head)
            try:
                s.sendall(data)
            except OSError:  # answered (503, 413) and closed before the whole body went out: read the answer
                pass
            answer = s.recv(64).split(b" ")
            status = answer[1].decode() if len(answer) > 1 else "no answer"
    except OSError as exc:
        status = type(exc).__name__
    with lock:
        statuses[status] = statuses.get(status, 0) + 1


def bodies(port: int, count: int, mib: float) -> dict[str, int]:
    bulk = "x" * int(mib * 2**20 - 200)
    data = json.dumps({"model": "gpt-neox-20b", "cluster": "frontier:48", "bulk": bulk}).encode()
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    threads = [threading.Thread(target=post, args=(port, data, statuses, lock)) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def slow_heads(port: int, count: int, drip_s: float, seconds: float) -> dict[str, int]:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 4096
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        socks.append(s)
    start, pos, open_at_end = time.monotonic(), 0, 0
    while time.monotonic() - start < seconds:
        open_at_end = 0
        for s in socks:
            try:
                s.send(head[pos:pos + 1])
                open_at_end += 1
            except OSError:
                pass
        pos = (pos + 1) % len(head)
        time.sleep(drip_s)
    for s in socks:
        s.close()
    return {"opened": count, "still_open": open_at_end}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, default=30)
    ap.add_argument("--body-mib", type=float, default=7.9)
    ap.add_argument("--slow", type=int, default=400, help="slow-head connections (0: none)")
    ap.add_argument("--slow-s", type=float, default=25.0)
    ap.add_argument("--drip-s", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "ZEROTUNE_DATA_DIR": tmp, "PYTHONPATH": str(ROOT), "ZEROTUNE_WORKERS": "0"}
        env.pop("ZEROTUNE_DB", None)
        log = open(Path(tmp) / "serve.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "zerotune.api.cli", "serve", "--port", str(port)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(url + "/readyz", timeout=2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        print(Path(tmp, "serve.log").read_text(), file=sys.stderr)
                        return 1
                    time.sleep(0.2)
            time.sleep(1.0)
            out: dict[str, object] = {"before_mb": round(memory_mb(proc.pid)["VmRSS"], 1)}
            health = Health(url)
            health.start()
            if args.bodies:
                start = time.monotonic()
                out["statuses"] = bodies(port, args.bodies, args.body_mib)
                out["bodies_s"] = round(time.monotonic() - start, 2)
                time.sleep(2.0)
                mem = memory_mb(proc.pid)
                out["peak_mb"], out["after_mb"] = round(mem["VmHWM"], 1), round(mem["VmRSS"], 1)
            if args.slow:
                out["slow_heads"] = slow_heads(port, args.slow, args.drip_s, args.slow_s)
            health.stopped.set()
            health.join()
            out["health"] = {"asked": health.asked, "worst_s": round(health.worst, 3),
                             "failures": len(health.failures), "first_failure": next(iter(health.failures), None)}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>12}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
