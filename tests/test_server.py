"""The plan service over real HTTP: a uvicorn server on a loopback port (``plan_server`` fixtures in
conftest.py), talked to with ``requests``. No timed assertions."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
import requests  # noqa: E402

from neurarch_trace.planner import make_plan  # noqa: E402
from neurarch_trace.server.cli import serve_main  # noqa: E402
from neurarch_trace.server.page import bundle  # noqa: E402

DATA = Path(__file__).parent / "data"
PLAN = "/api/v1/plan"


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.neurarch.json").read_text())


def post(base: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(base + PLAN, json=body, timeout=30, **kwargs)


def assert_error(response: requests.Response, status: int, contains: str = "") -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    assert "\n" not in body["error"] and body["error"]
    assert contains in body["error"]
    return body["error"]


# --- the contract ---------------------------------------------------------------------------------


def test_plan_answers_the_card_and_the_fields_clients_read(plan_server: str) -> None:
    source = {"kind": "trace", "target": "models/mlp.py:MLP", "input": "784", "tool": "neurarch-trace/0.1.0"}
    response = post(plan_server, {"model": load("mlp"), "source": source})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"text", "plan"}  # no url, no share_error without share
    assert body["text"] == make_plan(load("mlp"), source=source)["text"]
    plan = body["plan"]
    assert plan["run"]["legal"] is True and plan["run"]["blockers"] == []
    assert plan["model"]["params"] == 203_530 and isinstance(plan["model"]["params"], int)
    # the MLP's worked numbers, test_planner.test_mlp_numbers_by_hand
    assert plan["cost"]["peakGb"] == pytest.approx(1.008550068)
    assert plan["cost"]["activationGb"] == pytest.approx(0.004886528)
    assert plan["cost"]["seqLen"] is None
    assert "at batch 1024" in plan["cost"]["assumptions"]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_blockers_diff_and_options_over_http(plan_server: str) -> None:
    broken = load("tiny_cnn")
    broken["components"][1]["params"]["inChannels"] = 4
    response = post(plan_server, {"model": broken, "base": load("tiny_cnn"), "seq_len": 128, "attention": "eager"})
    plan = response.json()["plan"]
    assert plan["run"]["legal"] is False
    assert plan["run"]["blockers"] == ["'conv': inChannels 4 does not match its input channels 3"]
    assert plan["diff"]["layers"] == {"added": [], "removed": [], "changed": [{"name": "conv", "fields": ["params"]}]}
    assert plan["cost"]["seqLen"] is None  # an image model: seq_len does not apply


def test_share_stores_and_serves_the_page_and_json(plan_server: str) -> None:
    response = post(plan_server, {"model": load("tiny_cnn"), "share": True, "source": {"target": "cnn.py:TinyCNN"}})
    body = response.json()
    url = body["url"]
    share_id = url.rsplit("/", 1)[1]
    assert url == f"{plan_server}/p/{share_id}"
    assert len(share_id) == 24  # 18 random bytes = 144 bits, URL-safe base64
    page = requests.get(url, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]{20,})';", policy).group(1)  # the bundle's tag only
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "unsafe-eval" not in policy
    assert re.findall(r"<script[^>]*>", page.text) == [
        f'<script type="module" nonce="{nonce}" src="_static/neurarch-widget.js?v={bundle()[1]}">']
    script = requests.get(f"{plan_server}/p/_static/neurarch-widget.js", timeout=30)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert script.content == bundle()[0] and b"data-neurarch-share" in script.content
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "| Runs            yes, shapes propagate end to end" in page.text
    assert "<td><code>conv</code></td><td>conv2d</td>" in page.text
    stored = requests.get(url + ".json", timeout=30).json()
    assert stored["graph"] == load("tiny_cnn")
    assert stored["plan"] == body["plan"] and stored["text"] == body["text"] and stored["id"] == share_id


def test_page_escapes_every_string_from_the_graph(plan_server: str) -> None:
    doc = load("mlp")
    doc["name"] = '<script>alert("name")</script>'
    doc["components"][1]["name"] = "<img src=x onerror=alert(1)>"
    doc["components"][1]["type"] = "<b>linear</b>"
    doc["components"][1]["scope"] = '"><script>alert(2)</script>'
    url = post(plan_server, {"model": doc, "share": True}).json()["url"]
    page = requests.get(url, timeout=30).text
    # The one script is the service's own bundle; nothing from the graph becomes a tag.
    assert len(re.findall(r"<script", page)) == 1 and '<script type="module" nonce=' in page
    assert "alert" not in page.split("<script", 1)[1].split(">", 1)[0]
    assert "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&quot;name&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_without_share_nothing_is_stored(plan_server_factory: Any) -> None:
    server = plan_server_factory()
    doc = load("mlp")
    doc["name"] = "private-marker-7f3a9c"
    assert post(server, {"model": doc, "source": {"target": "secret/path.py:Net"}}).status_code == 200
    assert post(server, {"model": doc, "share": False}).status_code == 200
    with sqlite3.connect(server.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM shares").fetchone() == (0,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    for path in server.db_path.parent.glob(server.db_path.name + "*"):
        data = path.read_bytes()
        assert b"private-marker" not in data and b"secret/path" not in data, path


def test_unknown_share_is_a_404_that_reveals_nothing(plan_server: str) -> None:
    real = post(plan_server, {"model": load("mlp"), "share": True}).json()["url"]
    real_id = real.rsplit("/", 1)[1]
    wrong = ("A" if real_id[0] != "A" else "B") + real_id[1:]
    answers = [requests.get(f"{plan_server}/p/{suffix}", timeout=30) for suffix in
               (wrong, wrong + ".json", "short", "../etc/passwd", "x" * 300, "%00")]
    for answer in answers:
        assert answer.status_code == 404
        assert answer.json() == {"error": "not found"}


def test_shares_survive_a_restart(plan_server_factory: Any, tmp_path: Path) -> None:
    db = tmp_path / "persist.sqlite3"
    first = plan_server_factory(db_path=db)
    url = post(first, {"model": load("mlp"), "share": True}).json()["url"]
    share_id = url.rsplit("/", 1)[1]
    second = plan_server_factory(db_path=db)
    assert requests.get(f"{second}/p/{share_id}.json", timeout=30).json()["graph"]["name"] == "MLP"


def test_concurrent_share_requests_lose_nothing(plan_server_factory: Any) -> None:
    server = plan_server_factory(api_keys=("load-test-key",))
    headers = {"Authorization": "Bearer load-test-key"}

    def share(i: int) -> str:
        doc = load("mlp")
        doc["name"] = f"concurrent-{i}"
        response = post(server, {"model": doc, "share": True}, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["url"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        urls = list(pool.map(share, range(48)))
    assert len(set(urls)) == 48
    with ThreadPoolExecutor(max_workers=8) as pool:
        names = list(pool.map(lambda u: requests.get(u + ".json", timeout=30).json()["graph"]["name"], urls))
    assert names == [f"concurrent-{i}" for i in range(48)]
    with sqlite3.connect(server.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM shares").fetchone() == (48,)


# --- limits ---------------------------------------------------------------------------------------


def test_rate_limit_per_ip_and_keys(plan_server_factory: Any) -> None:
    server = plan_server_factory(rate_limit=2, api_keys=("good-key", "other-key"))
    body = {"model": load("mlp")}
    assert post(server, body).status_code == 200
    assert post(server, body).status_code == 200
    limited = post(server, body)
    assert_error(limited, 429, "NEURARCH_API_KEY")
    assert 1 <= int(limited.headers["retry-after"]) <= 3600
    assert post(server, body, headers={"Authorization": "Bearer good-key"}).status_code == 200
    assert post(server, body, headers={"Authorization": "Bearer other-key"}).status_code == 200
    for header in ("Bearer wrong-key", "Bearer ", "Basic Z29vZC1rZXk=", "good-key"):
        answer = post(server, body, headers={"Authorization": header})
        assert_error(answer, 401, "API key")
        assert answer.headers["www-authenticate"].startswith("Bearer")
    # share pages are not rate-limited
    keyed = {"Authorization": "Bearer good-key"}
    url = post(server, {"model": load("mlp"), "share": True}, headers=keyed).json()["url"]
    assert all(requests.get(url, timeout=30).status_code == 200 for _ in range(3))


def test_rate_limit_zero_means_unlimited(plan_server_factory: Any) -> None:
    server = plan_server_factory(rate_limit=0)
    assert all(post(server, {"model": load("mlp")}).status_code == 200 for _ in range(5))


DEEP = '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("raw, status, contains", [
    ("{not json", 400, "not valid JSON"),
    ("", 400, "empty"),
    (b"\xff\xfe{}", 400, "not valid JSON"),
    ('{"model": 1e999999}', 400, "has the number 1e999999, which is not finite"),
    ('{"model": {"components": [], "connections": [], "x": -1e309}}', 400, "numbers must be finite"),
    ('{"model": {"components": [], "connections": [], "x": 99999999999999999999}}', 400, "beyond 2^63"),
    ('{"model": ' + "9" * 5000 + "}", 400, "not valid JSON"),
    (DEEP, 400, "nests deeper"),
    ('{"model": ' + "[" * 40 + "]" * 40 + "}", 400, "nests deeper than 32 levels"),
    ('{"model": {"components": [], "connections": [], "x": NaN}}', 400, "NaN is not a JSON number"),
    ('{"model": {"name": "\\ud800", "components": [], "connections": []}}', 400, "unpaired surrogate"),
    ("[1, 2]", 422, "JSON object"),
    ("{}", 422, "'model' is required"),
    ('{"model": "graph.json"}', 422, "'model' is invalid"),
    ('{"model": {"name": "x"}}', 422, "model is not a graph"),
    ('{"model": {"components": [{"id": 3}], "connections": []}}', 422, "component 0 has no string 'id'"),
    ('{"model": {"components": [], "connections": []}, "share": "yes"}', 422, "'share' is invalid"),
    ('{"model": {"components": [], "connections": []}, "seq_len": "2048"}', 422, "'seq_len' is invalid"),
    ('{"model": {"components": [], "connections": []}, "seq_len": 0}', 422, "'seq_len' is invalid"),
    ('{"model": {"components": [], "connections": []}, "attention": "fast"}', 422, "'attention' is invalid"),
    ('{"model": {"components": [], "connections": []}, "base": [1]}', 422, "'base' is invalid"),
    ('{"model": {"components": [], "connections": []}, "base": {"x": 1}}', 422, "base is not a graph"),
    ('{"model": {"components": [], "connections": []}, "source": {"target": 7}}', 422, "'source.target' is invalid"),
])
def test_bad_input_is_a_4xx_with_one_sentence(plan_server: str, raw: Any, status: int, contains: str) -> None:
    data = raw.encode() if isinstance(raw, str) else raw
    answer = requests.post(plan_server + PLAN, data=data, headers={"Content-Type": "application/json"}, timeout=30)
    assert_error(answer, status, contains)


def test_body_size_limit(plan_server_factory: Any) -> None:
    server = plan_server_factory(max_body_bytes=4096)
    big = {"model": load("mlp"), "pad": "x" * 5000}
    assert_error(post(server, big), 413, "larger than this service accepts (4,096 bytes)")

    def chunks():  # no Content-Length: the limit holds while reading
        payload = json.dumps(big).encode()
        for i in range(0, len(payload), 1000):
            yield payload[i:i + 1000]

    chunked = requests.post(server + PLAN, data=chunks(), headers={"Content-Type": "application/json"}, timeout=30)
    assert_error(chunked, 413, "larger than")
    assert post(server, {"model": load("mlp")}).status_code == 200


def test_other_content_types_and_methods(plan_server: str) -> None:
    form = requests.post(plan_server + PLAN, data="model=x", headers={"Content-Type": "text/plain"}, timeout=30)
    assert_error(form, 415, "must be JSON")
    assert_error(requests.get(plan_server + PLAN, timeout=30), 405, "method not allowed")
    assert_error(requests.get(plan_server + "/nowhere", timeout=30), 404, "not found")


@pytest.mark.slow  # seconds of hostile graphs: the full run's
def test_hostile_graph_answers_quickly_not_a_hang(plan_server: str) -> None:
    n = 8_000  # linear work is well under a second; anything quadratic would be minutes
    comps = [{"id": "in", "name": "in", "type": "input", "params": {}, "outputShape": [8]}]
    comps += [{"id": f"n{i}", "name": f"n{i}", "type": "relu", "params": {}} for i in range(n)]
    comps += [{"id": f"c{i}", "name": f"c{i}", "type": "linear", "params": {}, "outputShape": [8]} for i in range(n)]
    conns = [{"id": f"a{i}", "from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)]
    conns += [{"id": f"b{i}", "from": f"c{i}", "to": "n0"} for i in range(n)]  # n producers of n0
    conns += [{"id": "loop", "from": f"n{n - 1}", "to": "n0"}]
    answer = post(plan_server, {"model": {"components": comps, "connections": conns}})
    assert answer.status_code == 200
    assert answer.json()["plan"]["run"]["legal"] is False


def test_unexpected_fault_still_answers_json(plan_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom with a secret path /home/x")

    monkeypatch.setattr(plan_server.app.state.pool, "plan", broken)
    error = assert_error(post(plan_server, {"model": load("mlp")}), 500)
    assert "boom" not in error and "/home" not in error


def test_share_error_when_the_store_fails(plan_server_factory: Any) -> None:
    server = plan_server_factory()
    with sqlite3.connect(server.db_path) as conn:  # every later share write fails; rate limits still count
        conn.execute("DROP TABLE shares")
    body = post(server, {"model": load("mlp"), "share": True}).json()
    assert "url" not in body and body["share_error"] == "the plan service could not store the share; nothing was stored"
    assert body["text"].startswith("+---")


# --- schema and health ----------------------------------------------------------------------------


def test_openapi_schema_is_published(plan_server: str) -> None:
    schema = requests.get(plan_server + "/openapi.json", timeout=30).json()
    operation = schema["paths"][PLAN]["post"]
    request_body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert request_body == {"$ref": "#/components/schemas/PlanRequest"}
    request = schema["components"]["schemas"]["PlanRequest"]
    assert request["required"] == ["model"]
    assert set(request["properties"]) == {"model", "share", "source", "base", "seq_len", "attention", "finetune",
                                          "context", "gpu", "usd_per_hour"}
    assert "Source" in schema["components"]["schemas"]
    assert set(schema["components"]["schemas"]["PlanResponse"]["properties"]) == {"text", "url", "share_error", "plan"}
    assert {"400", "401", "413", "422", "429"} <= set(operation["responses"])
    assert set(schema["paths"]) >= {PLAN, "/p/{share_id}", "/p/{share_id}.json", "/api/v1/health"}


def test_health(plan_server: str) -> None:
    assert requests.get(plan_server + "/api/v1/health", timeout=30).json()["status"] == "ok"


# --- neurarch-trace serve -------------------------------------------------------------------------


def test_serve_port_in_use_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert serve_main(["--port", str(port), "--db", str(tmp_path / "s.db")]) == 1
    err = capsys.readouterr().err
    assert err == (f"neurarch-trace: cannot listen on 127.0.0.1:{port}: the port is already in use "
                   "(choose another with --port)\n")


def test_serve_unwritable_db_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert serve_main(["--port", "0", "--db", str(blocker / "shares.sqlite3")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"neurarch-trace: cannot open the share database {blocker / 'shares.sqlite3'}: ")
    assert err.count("\n") == 1


def test_serve_makes_no_folder_for_a_db_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a typo in --db must not leave folders behind; only the default file's folder is made
    missing = tmp_path / "typo" / "deeper" / "shares.sqlite3"
    assert serve_main(["--port", "0", "--db", str(missing)]) == 1
    assert capsys.readouterr().err == (
        f"neurarch-trace: cannot open the share database {missing}: folder {missing.parent} does not exist; "
        "make it first, or give --db a path in a folder that does\n")
    assert list(tmp_path.iterdir()) == []


def test_serve_db_that_is_empty_or_a_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert serve_main(["--port", "0", "--db", ""]) == 1
    assert capsys.readouterr().err == ("neurarch-trace: --db needs a SQLite file path or a postgresql:// URL (leave it "
                                       "out for the default file)\n")
    assert serve_main(["--port", "0", "--db", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"neurarch-trace: cannot open the share database {tmp_path}: it is a folder; "
                                       f"give a file in it, such as {tmp_path / 'shares.sqlite3'}\n")


def test_serve_with_postgresql_down_is_one_line_with_the_reason(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("psycopg")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"postgresql://nobody:secret@127.0.0.1:{port}/shares"
    assert serve_main(["--port", "0", "--db", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "secret" not in err
    assert err.startswith(f"neurarch-trace: cannot connect to the share database "
                          f"postgresql://nobody:***@127.0.0.1:{port}/shares: connection failed: "), err
    assert "Connection refused" in err


@pytest.mark.parametrize("argv, message", [
    (["--public-url", "ftp://x"], "--public-url: must be an http(s) URL without a query or fragment"),
    (["--port", "-5"], "--port: must be greater than or equal to 0, not -5"),
    (["--port", "70000"], "--port: must be less than or equal to 65535, not 70000"),
    (["--workers", "0"], "--workers: must be greater than or equal to 1, not 0"),
    (["--forwarded-allow-ips", "10.0.0.1, garbage"],
     "--forwarded-allow-ips: 'garbage' is not an IP address or network (e.g. 10.0.0.1, 10.0.0.0/8, or * for any)"),
    (["--db", "http://x"], "--db: the database must be a file path, sqlite:///PATH or postgresql://..."),
    # argparse's own refusals: one line and exit 1 too, as the trace and plan commands give them
    (["--port", "abc"], "argument --port: invalid int value: 'abc' (see neurarch-trace serve --help)"),
    (["--bogus"], "unrecognized arguments: --bogus (see neurarch-trace serve --help)"),
    (["--log-level", "loud"], "argument --log-level: invalid choice: 'loud' (choose from 'critical', 'error', "
                              "'warning', 'info', 'debug') (see neurarch-trace serve --help)"),
])
def test_serve_bad_option_is_one_line(argv: list, message: str, capsys: pytest.CaptureFixture) -> None:
    try:
        code = serve_main(argv)
    except SystemExit as exc:  # argparse exits itself
        code = exc.code
    assert code == 1
    assert capsys.readouterr().err == f"neurarch-trace: {message}\n"


def test_serve_takes_proxy_addresses_and_networks() -> None:
    from neurarch_trace.server.settings import Settings

    assert Settings(forwarded_allow_ips="10.0.0.1, 10.0.0.0/8,::1,*").forwarded_allow_ips == "10.0.0.1,10.0.0.0/8,::1,*"


@pytest.mark.slow  # a service process started and stopped: the full run's
def test_python_dash_m_serves(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    keys = tmp_path / "keys.txt"
    keys.write_text("# one per line\nfile-key\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "neurarch_trace.server", "--port", str(port), "--db", str(tmp_path / "cli.db"),
         "--public-url", "https://plans.example.com/", "--rate-limit", "1", "--api-keys-file", str(keys),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):  # up to a minute for the interpreter to import and bind
            try:
                requests.get(base + "/api/v1/health", timeout=5)
                break
            except requests.ConnectionError:
                if proc.poll() is not None:
                    pytest.fail(proc.stderr.read())
                time.sleep(0.1)
        shared = post(base, {"model": load("mlp"), "share": True}).json()
        assert shared["url"].startswith("https://plans.example.com/p/")
        assert post(base, {"model": load("mlp")}).status_code == 429
        assert post(base, {"model": load("mlp")}, headers={"Authorization": "Bearer file-key"}).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert f"neurarch plan service on http://127.0.0.1:{port}" in err


def test_listening_on_every_interface_without_a_public_url_says_to_set_one() -> None:
    from neurarch_trace.server.cli import announcement
    from neurarch_trace.server.settings import Settings

    line = announcement(Settings(host="0.0.0.0", port=8000), 8000, "shares.db")
    assert line == ("neurarch plan service on http://0.0.0.0:8000 (shares in shares.db, links start "
                    "http://127.0.0.1:8000/p/); set --public-url to the address others reach this service at")
    line = announcement(Settings(host="0.0.0.0", port=8000, public_url="https://plans.example.com"), 8000, "x.db")
    assert line.endswith("links start https://plans.example.com/p/)")
    assert announcement(Settings(port=8000), 8000, "x.db").endswith("links start http://127.0.0.1:8000/p/)")


def test_a_service_without_keys_ignores_a_bearer_key(plan_server_factory) -> None:
    # a key exported for another deployment must not lock the user out of a keyless local one
    url = plan_server_factory(rate_limit=1)
    body = {"model": load("mlp")}
    first = requests.post(f"{url}/api/v1/plan", json=body, headers={"Authorization": "Bearer elsewhere"}, timeout=30)
    assert first.status_code == 200
    second = requests.post(f"{url}/api/v1/plan", json=body, headers={"Authorization": "Bearer elsewhere"}, timeout=30)
    assert second.status_code == 429
    assert second.json() == {"error": "rate limit reached: anonymous callers get 1 plan per hour per IP"}


def test_control_characters_never_reach_the_card() -> None:
    from neurarch_trace.planner import make_plan

    graph = load("mlp")
    graph["name"] = "evil\x1b[31mred\x07"
    text = make_plan(graph)["text"]
    assert "\x1b" not in text and "\x07" not in text
    assert all(len(line) == 68 for line in text.splitlines())


def test_serve_bad_duration_and_database_are_one_line(capsys: pytest.CaptureFixture) -> None:
    assert serve_main(["--share-ttl", "soon"]) == 1
    assert capsys.readouterr().err == "neurarch-trace: --share-ttl: 'soon' is not a duration (e.g. 3600, 12h, 30d)\n"
    assert serve_main(["--db", "mysql://x/y"]) == 1
    assert capsys.readouterr().err == ("neurarch-trace: --db: the database must be a file path, "
                                       "sqlite:///PATH or postgresql://...\n")


def test_a_version_1_database_is_migrated_to_strict_compressed_shares(plan_server_factory: Any,
                                                                       tmp_path: Path) -> None:
    db = tmp_path / "v1.sqlite3"
    with sqlite3.connect(db) as conn:  # the schema and a row as the first release wrote them
        conn.execute("CREATE TABLE shares (id TEXT PRIMARY KEY, created TEXT NOT NULL, name TEXT NOT NULL, "
                     "text TEXT NOT NULL, graph TEXT NOT NULL, plan TEXT NOT NULL)")
        conn.execute("INSERT INTO shares VALUES (?, ?, ?, ?, ?, ?)",
                     ("OldShareId0123456789abcd", "2026-11-30T12:00:00+00:00", "MLP", "+--card--+",
                      json.dumps(load("mlp")), '{"model": {"name": "MLP"}, "cost": {"peakGb": Infinity}}'))
    server = plan_server_factory(db_path=db)
    answer = requests.get(f"{server}/p/OldShareId0123456789abcd.json", timeout=30)

    def refuse(name: str) -> None:
        raise ValueError(name)

    doc = json.loads(answer.text, parse_constant=refuse)
    assert doc["graph"] == load("mlp") and doc["text"] == "+--card--+"
    assert doc["plan"] == {"model": {"name": "MLP"}, "cost": {"peakGb": None}}  # Infinity was never JSON
    assert doc["created"] == "2026-11-30T12:00:00+00:00"
    with sqlite3.connect(db) as conn:
        assert [r[1] for r in conn.execute("PRAGMA table_info(shares)")] == [
            "id", "created", "expires", "client", "size", "doc"]
