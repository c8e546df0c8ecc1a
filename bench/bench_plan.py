"""Plan latency and plan-service throughput, on loopback only.

    python bench/bench_plan.py [--repeat 20] [--requests 200] [--clients 1 4 8] [--json OUT]

Measures, for a ResNet-50-sized graph (177 components, estimated) and a LLaMA-7B-sized graph
(389 components, with measured fields) from :mod:`synthetic`:

1. ``make_plan`` latency in-process (median and 90th percentile over ``--repeat`` runs);
2. ``POST /api/v1/plan`` latency from one client, server in a separate process (so client and
   server do not share a GIL), and the HTTP overhead as a ratio to the in-process time;
   one request per connection, as ``neurarch-trace --plan`` makes it (on a kept-alive connection,
   a body over uvicorn's 64 KiB read high-water mark meets TCP's delayed ACK: about +40 ms a
   request on Linux loopback, a transport artifact rather than service time);
3. requests per second with 1, 4 and 8 concurrent clients (a fixed number of requests, a bearer
   key so the rate limit stays out of the way), and the speed-up over one client.

Every loop is bounded by a count; the server is stopped at the end. Numbers depend on the
machine: they are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Sequence

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import llama7b_graph, resnet50_graph  # noqa: E402

from neurarch_trace.planner import make_plan  # noqa: E402

KEY = "bench-key"


def _quantiles(samples: List[float]) -> Dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": 1000 * statistics.median(ordered),
            "p90_ms": 1000 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]}


def bench_in_process(graph: Dict[str, Any], repeat: int) -> Dict[str, float]:
    make_plan(graph)  # warm-up: imports, data file
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        make_plan(graph)
        samples.append(time.perf_counter() - start)
    return _quantiles(samples)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(db: str) -> tuple:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "neurarch_trace.server", "--port", str(port), "--db", db,
         "--api-keys", KEY, "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            requests.get(base + "/api/v1/health", timeout=2)
            return proc, base
        except requests.ConnectionError:
            if proc.poll() is not None:
                raise SystemExit(f"server did not start: {proc.stderr.read()}")
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit("server did not start within 30 s")


HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}", "Connection": "close"}


def _post(base: str, body: bytes) -> None:
    requests.post(base + "/api/v1/plan", data=body, headers=HEADERS, timeout=60).raise_for_status()


def bench_http(base: str, body: bytes, repeat: int) -> Dict[str, float]:
    _post(base, body)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        _post(base, body)
        samples.append(time.perf_counter() - start)
    return _quantiles(samples)


def bench_throughput(base: str, body: bytes, clients: int, total: int) -> float:
    per_client = max(1, total // clients)

    def run(_: int) -> int:
        for _ in range(per_client):
            _post(base, body)
        return per_client

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        done = sum(pool.map(run, range(clients)))
    return done / (time.perf_counter() - start)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description="plan latency and service throughput")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per latency figure")
    parser.add_argument("--requests", type=int, default=120, help="requests per throughput figure")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args(list(argv))

    graphs = {"resnet50": resnet50_graph(), "llama7b": llama7b_graph()}
    results: Dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    for name, graph in graphs.items():
        results[name] = {"components": len(graph["components"]),
                         "body_bytes": len(json.dumps({"model": graph})),
                         "in_process": bench_in_process(graph, args.repeat)}

    with tempfile.TemporaryDirectory() as tmp:
        proc, base = start_server(os.path.join(tmp, "bench.sqlite3"))
        try:
            for name, graph in graphs.items():
                body = json.dumps({"model": graph}).encode()
                http = bench_http(base, body, args.repeat)
                http["overhead_ratio"] = http["median_ms"] / results[name]["in_process"]["median_ms"]
                results[name]["http_one_client"] = http
            body = json.dumps({"model": graphs["resnet50"]}).encode()
            rps = {str(c): bench_throughput(base, body, c, args.requests) for c in args.clients}
            single = rps.get("1") or next(iter(rps.values()))
            results["throughput_resnet50"] = {
                "requests_per_s": rps, "speedup_vs_1_client": {c: v / single for c, v in rps.items()}}
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    for name in graphs:
        r = results[name]
        print(f"{name:9s} {r['components']:4d} components, {r['body_bytes'] / 1e3:7.1f} kB body: "
              f"make_plan median {r['in_process']['median_ms']:7.1f} ms (p90 {r['in_process']['p90_ms']:.1f}); "
              f"HTTP median {r['http_one_client']['median_ms']:7.1f} ms "
              f"(x{r['http_one_client']['overhead_ratio']:.2f} of in-process)")
    t = results["throughput_resnet50"]
    for clients, value in t["requests_per_s"].items():
        print(f"resnet50 plans/s with {clients:>2s} client(s): {value:7.1f} "
              f"(x{t['speedup_vs_1_client'][clients]:.2f} of one client)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
