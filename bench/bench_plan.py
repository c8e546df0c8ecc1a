"""Plan-service load: requests/s and p50/p99 latency on SQLite and PostgreSQL, on loopback only.

    python bench/bench_plan.py [--scale 1.0] [--backends sqlite postgresql] [--json OUT]

The service runs as ``neurarch-trace serve`` in its own process (its workers in theirs), so the
clients here do not share its GIL. Each measured request is an anonymous ``POST /api/v1/plan``
with ``share: true``: one rate-limit upsert and one share insert in the database, the plan in a
worker. Clients use kept-alive connections (one ``requests.Session`` each).

1. Kept-alive latency: sequential health calls and ResNet-50 plans on one connection (a socket
   without TCP_NODELAY made each of these wait ~40 ms for a delayed ACK).
2. For ResNet-50- (177 components), LLaMA-7B- (389, with measured fields) and 10,000-layer graphs:
   requests/s and p50/p99 latency with 1 (sequential), 8 and 32 concurrent clients, per backend.
   Baseline in the same run: the same app and transport served from a socket opened with
   ``proto=0`` (as ``serve`` used to open it), on which asyncio never sets TCP_NODELAY.
3. Two 100,000-layer plans in flight (``--plan-budget-s 300`` so they are planned, not refused;
   two large-plan workers): health and ResNet-50 plan latency meanwhile, against the same calls
   with the service idle, measured in the same run.

PostgreSQL: ``--pg-url URL``, else a private server this script starts with the installed
``initdb`` (as the ``postgres`` user when run as root) in a temporary folder, stopped at the end.
Every loop is bounded by a count; numbers depend on the machine and are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import llama7b_graph, resnet50_graph  # noqa: E402

PLAN = "/api/v1/plan"
JSON = {"Content-Type": "application/json"}
#: Requests per (graph, clients) figure at --scale 1: (sequential, 8 clients, 32 clients).
COUNTS = {"resnet50": (40, 160, 320), "llama7b": (40, 160, 320), "chain10k": (8, 24, 64)}


def chain_graph(n: int, width: int = 64) -> dict[str, Any]:
    """input -> n layers alternating linear and relu -> output, shaped like the tracer's output."""
    comps: list[dict[str, Any]] = [{"id": "in", "name": "x", "type": "input", "params": {"shape": [width]},
                                    "outputShape": [width]}]
    conns = []
    prev = "in"
    for i in range(n):
        linear = i % 2 == 0
        comps.append({"id": f"n{i}", "name": f"l{i}", "type": "linear" if linear else "relu",
                      "params": {"inFeatures": width, "outFeatures": width} if linear else {},
                      "inputShape": [width], "outputShape": [width]})
        conns.append({"id": f"e{i}", "from": prev, "to": f"n{i}"})
        prev = f"n{i}"
    comps.append({"id": "out", "name": "output", "type": "output", "params": {}, "inputShape": [width]})
    conns.append({"id": "eo", "from": prev, "to": "out"})
    return {"id": f"chain{n}", "name": f"Chain{n}", "description": "synthetic", "components": comps,
            "connections": conns}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def private_postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server on a free loopback port; yields its URL."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not found:
        raise SystemExit("no PostgreSQL binaries (apt-get install postgresql), or pass --pg-url")
    bindir, root, port = found[-1].parent, Path(tempfile.mkdtemp(prefix="neurarch-bench-pg-")), _free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    subprocess.run(as_user + [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                              "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run(as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-o",
                              f"-c listen_addresses=127.0.0.1 -p {port} -k {root}", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


#: The service as before the fix: the same app and transport on a socket opened with proto=0.
_PROTO0_SERVER = """
import socket, sys
from neurarch_trace.server import Settings, create_app
from neurarch_trace.server.transport import build_server
port, db = int(sys.argv[1]), sys.argv[2]
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # proto=0: asyncio sets no TCP_NODELAY
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sock.listen(128)
settings = Settings(port=port, database_url=db, rate_limit=0)
build_server(create_app(settings), settings, log_level="warning").run(sockets=[sock])
"""


class Service:
    """``python -m neurarch_trace.server`` on a free port with ``args``; a context manager.
    ``proto0``: the baseline server of :data:`_PROTO0_SERVER` instead."""

    def __init__(self, db: str, *args: str, proto0: bool = False) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-c", _PROTO0_SERVER, str(self.port), db] if proto0 else [
            sys.executable, "-m", "neurarch_trace.server", "--port", str(self.port), "--db", db,
            "--log-level", "warning", "--rate-limit", "1000000000", *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(600):
            try:
                requests.get(self.url + "/api/v1/health", timeout=2)
                self._warm_up()
                return
            except requests.ConnectionError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"server did not start: {self.proc.stderr.read()}") from None
                time.sleep(0.1)
        self.proc.terminate()
        raise SystemExit("server did not start within 60 s")

    def _warm_up(self) -> None:
        """Plans from 4 clients at once, so every small-plan worker has started before timing."""
        body = json.dumps({"model": resnet50_graph()}).encode()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda _: requests.post(self.url + PLAN, data=body, headers=JSON, timeout=60), range(8)))

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def _stats(samples: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(samples)
    return {"requests": len(ordered), "rps": len(ordered) / wall,
            "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def load(base: str, body: bytes, clients: int, total: int) -> dict[str, float]:
    """``total`` share plans from ``clients`` concurrent kept-alive clients."""
    per_client = max(1, total // clients)
    samples: list[float] = []
    busy: list[int] = []
    lock = threading.Lock()

    def run(_: int) -> None:
        with requests.Session() as session:
            for _ in range(per_client):
                start = time.perf_counter()
                answer = session.post(base + PLAN, data=body, headers=JSON, timeout=300)
                if answer.status_code == 503:  # admission control: a lane's queue was full
                    busy.append(1)
                    continue
                answer.raise_for_status()
                with lock:
                    samples.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(run, range(clients)))
    return {**_stats(samples, time.perf_counter() - start), "refused_503": len(busy)}


def sequential(base: str, calls: int, plan_body: Optional[bytes] = None) -> dict[str, float]:
    """``calls`` health calls (or plans of ``plan_body``) one after another on one connection."""
    samples = []
    with requests.Session() as session:
        session.get(base + "/api/v1/health", timeout=30)
        start = time.perf_counter()
        for _ in range(calls):
            t = time.perf_counter()
            if plan_body is None:
                session.get(base + "/api/v1/health", timeout=30).raise_for_status()
            else:
                session.post(base + PLAN, data=plan_body, headers=JSON, timeout=60).raise_for_status()
            samples.append(time.perf_counter() - t)
        return _stats(samples, time.perf_counter() - start)


def bench_backend(db: str, bodies: dict[str, bytes], scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Service(db) as service:
        small = json.dumps({"model": resnet50_graph()}).encode()
        out["keepalive_health"] = sequential(service.url, 200)
        out["keepalive_resnet50_plan"] = sequential(service.url, 40, small)
        for name, body in bodies.items():
            for clients, count in zip((1, 8, 32), COUNTS[name]):
                result = load(service.url, body, clients, max(clients, int(count * scale)))
                out[f"{name}/{clients}"] = result
                print(f"  {name:9s} {clients:2d} clients: {result['rps']:7.1f} req/s, p50 {result['p50_ms']:8.1f} ms, "
                      f"p99 {result['p99_ms']:8.1f} ms", flush=True)
    return out


def bench_nagle(db: str) -> dict[str, Any]:
    """Kept-alive health and ResNet-50 plans: the fixed socket against a ``proto=0`` one."""
    small = json.dumps({"model": resnet50_graph()}).encode()
    out: dict[str, Any] = {}
    for name, proto0 in (("proto0_baseline", True), ("ipproto_tcp", False)):
        with Service(db, proto0=proto0) as service:
            out[name] = {"health": sequential(service.url, 100), "resnet50": sequential(service.url, 40, small)}
    for what in ("health", "resnet50"):
        out[f"{what}_p50_ratio"] = out["proto0_baseline"][what]["p50_ms"] / out["ipproto_tcp"][what]["p50_ms"]
    return out


def bench_two_big(db: str, scale: float) -> dict[str, Any]:
    """Health and ResNet-50 plan latency, idle and then with two 100,000-layer plans in flight."""
    big = json.dumps({"model": chain_graph(100_000)}, separators=(",", ":")).encode()
    small = json.dumps({"model": resnet50_graph()}).encode()
    calls = max(5, int(30 * scale))
    with Service(db, "--plan-budget-s", "300", "--heavy-workers", "2") as service:
        idle = {"health": sequential(service.url, calls), "resnet50": sequential(service.url, calls, small)}
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(requests.post, service.url + PLAN, data=big, headers=JSON, timeout=600)
                       for _ in range(2)]
            time.sleep(1.5)  # both bodies read (16 MB each) and in the large-plan lane
            busy = {"health": sequential(service.url, calls), "resnet50": sequential(service.url, calls, small)}
            in_flight = sum(not f.done() for f in futures)
            statuses = [f.result().status_code for f in futures]
        big_s = time.perf_counter() - started
    return {"big_body_bytes": len(big), "idle": idle, "busy": busy, "big_in_flight_after": in_flight,
            "big_statuses": statuses, "big_wall_s": big_s}


def _print_table(results: dict[str, Any]) -> None:
    print("\n| graph | clients | " + " | ".join(f"{b} req/s | {b} p50 ms | {b} p99 ms" for b in results["backends"])
          + " |")
    print("|---|---|" + "---|---|---|" * len(results["backends"]))
    for name in COUNTS:
        for clients in (1, 8, 32):
            cells = []
            for backend in results["backends"]:
                r = results["backends"][backend][f"{name}/{clients}"]
                cells.append(f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f}")
            print(f"| {name} | {clients} | " + " | ".join(cells) + " |")
    for backend, r in results["backends"].items():
        print(f"{backend}: kept-alive health p50 {r['keepalive_health']['p50_ms']:.2f} ms "
              f"(p99 {r['keepalive_health']['p99_ms']:.2f}), ResNet-50 plan p50 "
              f"{r['keepalive_resnet50_plan']['p50_ms']:.1f} ms (p99 {r['keepalive_resnet50_plan']['p99_ms']:.1f})")
    nagle = results["nagle"]
    for what in ("health", "resnet50"):
        print(f"kept-alive {what}: p50 {nagle['ipproto_tcp'][what]['p50_ms']:.2f} ms with TCP_NODELAY, "
              f"{nagle['proto0_baseline'][what]['p50_ms']:.2f} ms on a proto=0 socket "
              f"(x{nagle[f'{what}_p50_ratio']:.1f})")
    two = results["two_big"]
    for what in ("health", "resnet50"):
        print(f"two 100k plans in flight: {what} p50 {two['busy'][what]['p50_ms']:.1f} ms, p99 "
              f"{two['busy'][what]['p99_ms']:.1f} ms (idle: p50 {two['idle'][what]['p50_ms']:.1f}, p99 "
              f"{two['idle'][what]['p99_ms']:.1f}); big ones still in flight after: {two['big_in_flight_after']}/2, "
              f"answered {two['big_statuses']} after {two['big_wall_s']:.1f} s")


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description="plan-service load on SQLite and PostgreSQL")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every request count")
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--pg-url", default=None, help="an existing PostgreSQL database (default: start one)")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args(list(argv))

    graphs = {"resnet50": resnet50_graph(), "llama7b": llama7b_graph(), "chain10k": chain_graph(10_000)}
    bodies = {name: json.dumps({"model": g, "share": True}).encode() for name, g in graphs.items()}
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "body_bytes": {name: len(b) for name, b in bodies.items()}, "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            print(f"{backend}:", flush=True)
            if backend == "sqlite":
                results["backends"]["sqlite"] = bench_backend(os.path.join(tmp, "bench.sqlite3"), bodies, args.scale)
            elif args.pg_url:
                results["backends"]["postgresql"] = bench_backend(args.pg_url, bodies, args.scale)
            else:
                with private_postgres() as url:
                    results["backends"]["postgresql"] = bench_backend(url, bodies, args.scale)
        results["nagle"] = bench_nagle("sqlite:///" + os.path.join(tmp, "nagle.sqlite3"))
        results["two_big"] = bench_two_big(os.path.join(tmp, "big.sqlite3"), args.scale)
    _print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
