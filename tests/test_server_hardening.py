"""Regression tests for the plan service's limits (issue 13), each over real HTTP on loopback.

Every server here is the real app on uvicorn with the transport `serve` uses (conftest's
``plan_server_factory``), talked to with ``requests`` or a raw socket. No timed assertions: where a
defect was about time, the test asserts the order of events, a socket option, or that the server
closed a connection that it used to keep open.
"""

from __future__ import annotations

import gzip
import json
import socket
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
import requests  # noqa: E402

from neurarch_trace.server.ratelimit import SWEEP_EVERY  # noqa: E402
from neurarch_trace.server.transport import bind_socket  # noqa: E402

DATA = Path(__file__).parent / "data"
PLAN = "/api/v1/plan"
JSON = {"Content-Type": "application/json"}


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.neurarch.json").read_text())


def chain(n: int, width: int = 64) -> dict:
    """input -> n layers alternating linear and relu -> output, as the tracer writes them."""
    comps = [{"id": "in", "name": "x", "type": "input", "params": {"shape": [width]}, "outputShape": [width]}]
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
    return {"id": "chain", "name": f"Chain{n}", "description": "", "components": comps, "connections": conns}


def error_of(response: requests.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"] and body["error"] and "\n" not in body["error"]
    return body["error"]


def raw_exchange(port: int, data: bytes, then: Any = None, timeout: float = 20.0) -> bytes:
    """Send ``data`` on a fresh connection (``then(sock)`` may send more), read until the server
    closes. Fails if the server keeps the connection open past ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        if data:
            sock.sendall(data)
        if then is not None:
            then(sock)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def json_error_answer(raw: bytes, status: int) -> str:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw[:200]
    assert b"content-type: application/json" in head.lower()
    return json.loads(body)["error"]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# --- 1. one request cannot hold the service -------------------------------------------------------


@pytest.mark.slow  # seconds of real waiting (timeouts, big plans): the full run's
def test_small_requests_answer_while_two_large_plans_run(plan_server_factory: Any) -> None:
    server = plan_server_factory(plan_budget_s=3.0, heavy_workers=2, rate_limit=0)
    big = json.dumps({"model": chain(100_000)}, separators=(",", ":")).encode()
    assert len(big) < server.settings.max_body_bytes  # a legal body: only its cost is refused
    heavy = server.app.state.pool.heavy
    with ThreadPoolExecutor(max_workers=2) as clients:
        futures = [clients.submit(requests.post, server + PLAN, data=big, headers=JSON, timeout=120)
                   for _ in range(2)]
        for _ in range(600):  # both bodies read and handed to the large-plan lane
            if heavy.pending == 2:
                break
            time.sleep(0.05)
        assert heavy.pending == 2
        with requests.Session() as session:
            healths = [session.get(server + "/api/v1/health", timeout=30) for _ in range(5)]
            tiny = [session.post(server + PLAN, json={"model": load("mlp")}, timeout=30) for _ in range(3)]
        still_running = [not f.done() for f in futures]
        answers = [f.result() for f in futures]
    assert [r.status_code for r in healths] == [200] * 5
    assert [r.status_code for r in tiny] == [200] * 3
    assert tiny[0].json()["plan"]["model"]["params"] == 203_530
    assert still_running == [True, True]  # the small ones were answered while both large ones ran
    for answer in answers:
        sentence = error_of(answer, 413)
        assert sentence.startswith("the plan needs more than 3 s of CPU time, this service's limit per request")


@pytest.mark.slow  # seconds of real waiting (timeouts, big plans): the full run's
def test_a_plan_over_the_fast_lane_slice_moves_to_the_large_lane(plan_server_factory: Any) -> None:
    # 20,000 layers in a body under the fast-lane size: more than a 0.05 s slice, well within 5 s
    server = plan_server_factory(fast_lane_bytes=16 * 2**20, fast_lane_budget_s=0.05, rate_limit=0)
    answer = requests.post(server + PLAN, json={"model": chain(20_000)}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["plan"]["model"]["layers"] == 20_000


# --- 2. TCP_NODELAY -------------------------------------------------------------------------------


def test_served_connections_have_tcp_nodelay(plan_server: Any) -> None:
    listener = bind_socket("127.0.0.1", 0)
    try:
        assert listener.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY only for such sockets
    finally:
        listener.close()
    with requests.Session() as session:  # keep-alive: the same connection answers every call
        for _ in range(3):
            assert session.get(plan_server + "/api/v1/health", timeout=30).status_code == 200
        connections = list(plan_server.server.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


# --- 3. forwarded headers and rate-limit buckets --------------------------------------------------


def _bucket_rows(server: Any) -> int:
    with sqlite3.connect(server.db_path) as conn:
        return conn.execute("SELECT COUNT(*) FROM rate_buckets").fetchone()[0]


def test_x_forwarded_for_mints_no_bucket_unless_the_proxy_is_trusted(plan_server_factory: Any) -> None:
    body = {"model": load("mlp")}
    untrusted = plan_server_factory(rate_limit=2)
    codes = [requests.post(untrusted + PLAN, json=body, timeout=30,
                           headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code for i in range(6)]
    assert codes == [200, 200, 429, 429, 429, 429]
    assert _bucket_rows(untrusted) == 1

    trusted = plan_server_factory(rate_limit=2, forwarded_allow_ips="127.0.0.1")
    codes = [requests.post(trusted + PLAN, json=body, timeout=30,
                           headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code for i in range(6)]
    assert codes == [200] * 6  # a trusted proxy names six clients
    # an IPv6 client is one bucket per /64: rotating the interface id gains nothing
    codes = [requests.post(trusted + PLAN, json=body, timeout=30,
                           headers={"X-Forwarded-For": f"2001:db8:7:9::{i:x}"}).status_code for i in range(1, 4)]
    assert codes == [200, 200, 429]


@pytest.mark.slow  # thousands of requests: the full run's
def test_rate_limit_buckets_are_capped(plan_server_factory: Any) -> None:
    server = plan_server_factory(rate_limit=5, forwarded_allow_ips="127.0.0.1", rate_buckets_max=20)
    with requests.Session() as session:
        for i in range(3 * SWEEP_EVERY):  # a 415 after the count: cheap, and still a call
            headers = {"X-Forwarded-For": f"10.{i // 250}.{i % 250}.1", "Content-Type": "text/plain"}
            answer = session.post(server + PLAN, data=b"x", headers=headers, timeout=30)
            assert answer.status_code == 415
    assert _bucket_rows(server) <= 20 + SWEEP_EVERY


# --- 4. shares: stored once, compressed, with a quota and an expiry -------------------------------


@pytest.mark.slow  # seconds of real waiting (timeouts, big plans): the full run's
def test_a_share_is_stored_once_and_compressed(plan_server_factory: Any) -> None:
    server = plan_server_factory(rate_limit=0)
    body = json.dumps({"model": chain(10_000), "share": True}).encode()
    answer = requests.post(server + PLAN, data=body, headers=JSON, timeout=120)
    url = answer.json()["url"]
    share_id = url.rsplit("/", 1)[1]
    with sqlite3.connect(server.db_path) as conn:
        rows = conn.execute("SELECT id, size, length(doc) FROM shares").fetchall()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert len(rows) == 1 and rows[0][0] == share_id and rows[0][1] == rows[0][2]
    assert rows[0][1] * 5 < len(body)  # the old store kept about 3x the request
    assert server.db_path.stat().st_size < len(body)
    plain = requests.get(url + ".json", headers={"Accept-Encoding": "identity"}, timeout=30)
    assert "content-encoding" not in plain.headers
    packed = requests.get(url + ".json", headers={"Accept-Encoding": "gzip"}, timeout=30, stream=True)
    assert packed.headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(packed.raw.read())) == plain.json()
    doc = plain.json()
    assert doc["graph"]["components"][5] == chain(10_000)["components"][5]
    assert doc["plan"] == answer.json()["plan"] and doc["id"] == share_id
    page = requests.get(url, timeout=60)  # rendered from the one stored document
    assert page.status_code == 200 and "Chain10000" in page.text


def test_share_quota_per_client(plan_server_factory: Any) -> None:
    server = plan_server_factory(share_quota_bytes=6000, api_keys=("team-key",))
    body = {"model": load("mlp"), "share": True}
    answers = [requests.post(server + PLAN, json=body, timeout=30).json() for _ in range(6)]
    stored = [a for a in answers if "url" in a]
    refused = [a for a in answers if "share_error" in a]
    assert stored and refused and len(stored) + len(refused) == 6
    assert answers.index(refused[0]) == len(stored)  # refusals only once the quota is used
    assert refused[0]["share_error"] == ("this client's share quota (6,000 bytes compressed per day) is used "
                                         "up; the plan was not stored")
    assert refused[0]["text"].startswith("+---")  # the card still comes back
    keyed = requests.post(server + PLAN, json=body, headers={"Authorization": "Bearer team-key"}, timeout=30)
    assert "url" in keyed.json()  # a key is its own client
    with sqlite3.connect(server.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM shares").fetchone()[0] == len(stored) + 1


@pytest.mark.slow  # seconds of real waiting (timeouts, big plans): the full run's
def test_share_ttl_expires_shares(plan_server_factory: Any) -> None:
    server = plan_server_factory(share_ttl_s=1.0)
    url = requests.post(server + PLAN, json={"model": load("mlp"), "share": True}, timeout=30).json()["url"]
    assert requests.get(url + ".json", timeout=30).status_code == 200
    time.sleep(1.5)
    assert error_of(requests.get(url + ".json", timeout=30), 404) == "not found"
    assert error_of(requests.get(url, timeout=30), 404) == "not found"
    requests.post(server + PLAN, json={"model": load("mlp"), "share": True}, timeout=30)  # purges on write
    with sqlite3.connect(server.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM shares").fetchone()[0] == 1


# --- 5. non-finite numbers ------------------------------------------------------------------------


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the answer")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_refused_and_every_answer_is_strict_json(plan_server: str) -> None:
    raw = json.dumps({"model": load("mlp"), "share": True}).replace('"outFeatures": 256', '"outFeatures": 1e309')
    assert "1e309" in raw
    sentence = error_of(requests.post(plan_server + PLAN, data=raw.encode(), headers=JSON, timeout=30), 400)
    assert "1e309" in sentence and "finite" in sentence
    raw = b'{"model": {"components": [], "connections": []}, "seq_len": -1E400}'
    assert "finite" in error_of(requests.post(plan_server + PLAN, data=raw, headers=JSON, timeout=30), 400)
    huge = load("mlp")  # finite numbers whose products overflow a float
    for comp in huge["components"]:
        if "outputShape" in comp:
            comp["outputShape"] = [2**62] * 6
    answer = requests.post(plan_server + PLAN, json={"model": huge, "share": True}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "'fc1': outputShape has a dimension over 2^40" in _strict(answer.text)["plan"]["run"]["blockers"]
    _strict(requests.get(answer.json()["url"] + ".json", timeout=30).text)


# --- 6. read timeouts and a connection cap --------------------------------------------------------


@pytest.mark.slow  # seconds of real waiting (timeouts, big plans): the full run's
def test_slow_clients_are_cut_off(plan_server_factory: Any) -> None:
    server = plan_server_factory(header_timeout_s=1.0, read_timeout_s=1.0, body_timeout_s=2.0)
    port = port_of(server)
    partial_headers = raw_exchange(port, b"POST /api/v1/plan HTTP/1.1\r\nHost: x\r\n")
    assert "request headers did not arrive within 1 seconds" in json_error_answer(partial_headers, 408)
    head = b"POST /api/v1/plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    stalled = raw_exchange(port, head + b'{"model"')
    assert "stalled for 1 seconds" in json_error_answer(stalled, 408)

    def trickle(sock: socket.socket) -> None:
        for _ in range(40):  # a byte every 0.25 s: never silent for the read timeout, but slow
            try:
                sock.sendall(b" ")
            except OSError:
                return
            time.sleep(0.25)

    slow = raw_exchange(port, head, then=trickle)
    assert "body did not arrive within 2 seconds" in json_error_answer(slow, 408)
    assert raw_exchange(port, b"") == b""  # a silent connection is closed without an answer
    assert requests.get(server + "/api/v1/health", timeout=30).status_code == 200


def test_connection_cap_answers_json_503(plan_server_factory: Any) -> None:
    server = plan_server_factory(max_connections=3, header_timeout_s=30.0)
    port = port_of(server)
    held = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(3)]
    try:
        for sock in held:  # each is accepted and held open
            sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.2)
        over = raw_exchange(port, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert json_error_answer(over, 503) == "the plan service has too many open connections; retry shortly"
    finally:
        for sock in held:
            sock.close()
    for _ in range(100):  # the held connections are gone once the server sees them close
        if len(server.server.server_state.connections) == 0:
            break
        time.sleep(0.05)
    assert requests.get(server + "/api/v1/health", timeout=30).status_code == 200


# --- 7. the smaller defects -----------------------------------------------------------------------


def test_http_layer_errors_are_json(plan_server: str) -> None:
    answer = raw_exchange(port_of(plan_server), b"NOT HTTP AT ALL\r\n\r\n")
    assert json_error_answer(answer, 400) == "the request is not valid HTTP/1.1"


def test_body_without_content_type_or_compressed_is_a_415(plan_server: str) -> None:
    body = json.dumps({"model": load("mlp"), "share": True}).encode()
    bare = requests.post(plan_server + PLAN, data=body, timeout=30)  # requests sends no Content-Type for bytes
    assert "content-type" not in {k.lower() for k in bare.request.headers}
    assert error_of(bare, 415) == ("the request body must be JSON (Content-Type: application/json); "
                                   "this request has no Content-Type")
    packed = requests.post(plan_server + PLAN, data=gzip.compress(body), timeout=30,
                           headers={**JSON, "Content-Encoding": "gzip"})
    assert error_of(packed, 415).startswith("the request body must not be compressed (Content-Encoding: gzip")


def test_head_and_trailing_slash_on_shares(plan_server: str) -> None:
    url = requests.post(plan_server + PLAN, json={"model": load("mlp"), "share": True}, timeout=30).json()["url"]
    share_id = url.rsplit("/", 1)[1]
    for target in (url, url + ".json"):
        head = requests.head(target, timeout=30)
        assert head.status_code == 200 and head.content == b""
    assert requests.head(f"{plan_server}/p/{'A' * 24}", timeout=30).status_code == 404
    slash = requests.get(url + "/", headers={"Host": "evil.example"}, allow_redirects=False, timeout=30)
    assert slash.status_code == 308 and slash.headers["location"] == f"../{share_id}"
    # HEAD answers as GET does (it was 405)
    slash_head = requests.head(url + "/", allow_redirects=False, timeout=30)
    assert slash_head.status_code == 308 and slash_head.headers["location"] == f"../{share_id}"
    assert requests.head(f"{plan_server}/p/{'!' * 24}/", timeout=30).status_code == 404
    followed = requests.get(url + "/", timeout=30)
    assert followed.status_code == 200 and followed.url == url
    assert error_of(requests.get(plan_server + "/api/v1/health/", allow_redirects=False, timeout=30), 404)


def test_openapi_publishes_the_graph_and_json_errors(plan_server: str) -> None:
    schema = requests.get(plan_server + "/openapi.json", timeout=30).json()
    components = schema["components"]["schemas"]
    request = components["PlanRequest"]["properties"]
    assert request["model"]["$ref"] == "#/components/schemas/Graph"
    graph = components["Graph"]
    assert set(graph["required"]) == {"components", "connections"}
    assert graph["properties"]["components"]["items"] == {"$ref": "#/components/schemas/Component"}
    assert set(components["Component"]["required"]) == {"id", "name", "type", "params"}
    assert set(components["Connection"]["required"]) == {"id", "from", "to"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert list(response["content"]) == ["application/json"], (path, method, status)
    assert schema["paths"]["/p/{share_id}"]["get"]["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"}


def test_wide_characters_keep_the_card_box(plan_server: str) -> None:
    wcwidth = pytest.importorskip("wcwidth")  # an independent width table
    doc = load("tiny_cnn")
    doc["name"] = "画像分類モデル🚀 ResNet 改良版 テスト"
    doc["components"][1]["name"] = "畳み込み層一"
    doc["components"][1]["params"]["inChannels"] = 4  # a blocker naming the layer
    source = {"target": "モデル/ネットワーク定義/画像分類.py:Net"}
    answer = requests.post(plan_server + PLAN, json={"model": doc, "source": source}, timeout=30).json()
    lines = answer["text"].splitlines()
    assert any("画像分類" in line for line in lines) and any("畳み込み層一" in line for line in lines)
    assert [wcwidth.wcswidth(line) for line in lines] == [68] * len(lines)
    assert all(line[0] in "+|" and line[-1] in "+|" for line in lines)


@pytest.mark.slow  # seconds of real waiting (timeouts, big plans): the full run's
def test_a_plan_over_the_worker_memory_cap_is_a_413(plan_server_factory: Any) -> None:
    # a worker's address space starts near 250 MiB (interpreter, planner, thread arenas); a
    # 100,000-layer plan peaks near 450 MiB, a small one adds a few MiB
    server = plan_server_factory(worker_memory_mb=360, plan_budget_s=60.0, rate_limit=0)
    assert requests.post(server + PLAN, json={"model": load("mlp")}, timeout=30).status_code == 200
    big = json.dumps({"model": chain(100_000)}, separators=(",", ":")).encode()
    sentence = error_of(requests.post(server + PLAN, data=big, headers=JSON, timeout=120), 413)
    assert sentence == "the plan needs more memory than this service allows one request; send a smaller graph"
    again = requests.post(server + PLAN, data=big, headers=JSON, timeout=120)  # the worker lived on
    assert again.status_code == 413 and again.json()["error"] == sentence
    assert requests.post(server + PLAN, json={"model": load("mlp")}, timeout=30).status_code == 200
