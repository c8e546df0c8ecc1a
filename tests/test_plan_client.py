"""The plan client as a library: ``request_plan`` over real HTTP on loopback.

Against the reference service (the ``plan_server`` fixtures of conftest.py) and against small
standard-library servers that misbehave on purpose: refused connections, a server slower than the
timeout, 5xx with an error body, HTML, JSON without ``text``, redirects.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import requests
from canned_server import CARD, CannedServer, small_graph

from neurarch_trace._version import __version__
from neurarch_trace.errors import GraphError, NeurarchError
from neurarch_trace.plan_client import (
    DEFAULT_API,
    PlanConnectionError,
    PlanError,
    PlanRateLimitError,
    PlanResponse,
    PlanResponseError,
    PlanStatusError,
    PlanTimeoutError,
    api_base,
    api_host,
    request_plan,
    trace_source,
    user_agent,
)

REPO = Path(__file__).resolve().parents[1]


def assert_one_line(error: BaseException) -> None:
    text = str(error)
    assert text and "\n" not in text and "\r" not in text, text


# ----------------------------------------------------------------------------- import weight


def test_importing_the_client_and_its_front_end_loads_no_torch() -> None:
    code = (
        "import sys, neurarch_trace.plan_client, neurarch_trace.plan_cli; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=True)
    assert done.stdout == "[]\n"


# ---------------------------------------------------------------------------- configuration


def test_api_base_defaults_to_the_hosted_service_with_www() -> None:
    assert api_base() == "https://www.neurarch.com" == DEFAULT_API


@pytest.mark.parametrize("value", ["http://10.0.0.5:8080", "http://10.0.0.5:8080/", "http://10.0.0.5:8080//"])
def test_api_base_reads_neurarch_api_and_drops_trailing_slashes(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NEURARCH_API", value)
    assert api_base() == "http://10.0.0.5:8080"
    assert api_host() == "10.0.0.5:8080"


def test_api_host_names_the_host_only() -> None:
    assert api_host("https://www.neurarch.com") == "www.neurarch.com"
    assert api_host("https://user:secret@plans.example.org/base") == "plans.example.org"
    assert api_host("http://[::1]:9000") == "[::1]:9000"


def test_user_agent_and_trace_source_name_the_tool_and_version() -> None:
    assert user_agent() == f"neurarch-trace/{__version__}"
    assert trace_source("models/resnet.py:ResNet18", ["1,3,224,224"]) == {
        "kind": "trace", "target": "models/resnet.py:ResNet18", "input": "1,3,224,224",
        "tool": f"neurarch-trace/{__version__}",
    }
    assert trace_source("m.py:M", ["1,16:long", "mask=1,16:long"])["input"] == "1,16:long mask=1,16:long"


# ------------------------------------------------------------------------ the request it sends


def test_request_carries_the_contract_headers_and_body(canned: CannedServer) -> None:
    canned.answer(200, {"text": CARD})
    graph, base = small_graph(), small_graph(in_features=8)
    source = trace_source("m.py:Small", ["1,4"])
    answer = request_plan(graph, share=True, base=base, source=source, seq_len=128,
                          attention="eager", api=canned.url + "/", api_key="k-123")
    assert answer.text == CARD
    [req] = canned.requests
    assert req["method"] == "POST" and req["path"] == "/api/v1/plan"
    headers = {k.lower(): v for k, v in req["headers"].items()}
    assert headers["content-type"] == "application/json"
    assert headers["accept"] == "application/json"
    assert headers["user-agent"] == f"neurarch-trace/{__version__}"
    assert headers["authorization"] == "Bearer k-123"
    assert req["body"] == {"model": graph, "share": True, "source": source, "base": base,
                           "seq_len": 128, "attention": "eager"}


def test_key_comes_from_the_environment_and_is_omitted_when_empty(
    canned: CannedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    canned.answer(200, {"text": CARD})
    monkeypatch.setenv("NEURARCH_API", canned.url + "/")
    monkeypatch.setenv("NEURARCH_API_KEY", "from-env")
    request_plan(small_graph())
    monkeypatch.setenv("NEURARCH_API_KEY", "")
    request_plan(small_graph())
    monkeypatch.setenv("NEURARCH_API_KEY", "from-env")
    request_plan(small_graph(), api_key="")  # an explicit "" sends no key
    sent = [{k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in canned.requests]
    assert sent == ["Bearer from-env", None, None]
    assert [r["body"] for r in canned.requests] == [{"model": small_graph(), "share": False}] * 3


def test_arguments_out_of_range_are_value_errors_and_nothing_is_sent(canned: CannedServer) -> None:
    for kwargs in ({"seq_len": 0}, {"seq_len": True}, {"seq_len": 1.5}, {"attention": "fast"},
                   {"timeout": 0}, {"timeout": -1.0}):
        with pytest.raises(ValueError):
            request_plan(small_graph(), api=canned.url, **kwargs)
    with pytest.raises(GraphError, match="must be a dict"):
        request_plan([1, 2], api=canned.url)  # type: ignore[arg-type]
    with pytest.raises(GraphError, match="cannot be sent as JSON"):
        request_plan({**small_graph(), "measured": {"flops": math.nan}}, api=canned.url)
    assert canned.requests == []


@pytest.mark.parametrize("api", ["ftp://example.org", "www.neurarch.com", "http://"])
def test_an_address_that_is_not_http_is_a_plan_error(api: str) -> None:
    with pytest.raises(PlanError) as info:
        request_plan(small_graph(), api=api)
    assert type(info.value) is PlanError
    assert str(info.value) == (
        f"the plan service address {api!r} is not an http(s) URL; "
        "set NEURARCH_API to one such as https://www.neurarch.com, or unset it"
    )


# ------------------------------------------------------------------------------ the answer


def test_share_answer_and_plan_verdict(canned: CannedServer) -> None:
    plan = {"run": {"legal": True, "blockers": []}, "model": {"params": 10}}
    canned.answer(200, {"text": CARD, "url": "http://x/p/abc", "plan": plan, "extra": 1})
    answer = request_plan(small_graph(), share=True, api=canned.url)
    assert answer == PlanResponse(text=CARD, url="http://x/p/abc", share_error=None, plan=plan,
                                  raw={"text": CARD, "url": "http://x/p/abc", "plan": plan, "extra": 1})
    assert answer.blocked is False and answer.blockers == []
    assert str(answer) == CARD


@pytest.mark.parametrize(
    "run, blocked, blockers",
    [
        ({"legal": False, "blockers": []}, True, []),
        ({"legal": True, "blockers": ["fc: inFeatures 8 but input has 4"]}, True,
         ["fc: inFeatures 8 but input has 4"]),
        ({"legal": True}, False, []),
        ({}, None, []),
        (None, None, []),
    ],
)
def test_blocked_reads_legal_and_blockers(run: Optional[dict], blocked: Optional[bool], blockers: list) -> None:
    plan = {"run": run} if run is not None else {}
    answer = PlanResponse(text=CARD, plan=plan)
    assert answer.blocked is blocked
    assert answer.blockers == blockers


def test_share_without_url_explains_why(canned: CannedServer) -> None:
    canned.answer(200, {"text": CARD, "share_error": "Sharing is off on this deployment."})
    answer = request_plan(small_graph(), share=True, api=canned.url)
    assert (answer.text, answer.url, answer.share_error) == (CARD, None, "Sharing is off on this deployment.")
    canned.answer(200, {"text": CARD})
    answer = request_plan(small_graph(), share=True, api=canned.url)
    assert (answer.url, answer.share_error) == (None, "the service returned no share URL and gave no reason")
    answer = request_plan(small_graph(), share=False, api=canned.url)
    assert (answer.url, answer.share_error) == (None, None)


# ------------------------------------------------------------------------------ failures


def test_nothing_listening_is_a_connection_error(refused_port: int) -> None:
    with pytest.raises(PlanConnectionError) as info:
        request_plan(small_graph(), api=f"http://127.0.0.1:{refused_port}")
    err = info.value
    assert type(err) is PlanConnectionError
    assert str(err) == f"could not connect to the plan service at 127.0.0.1:{refused_port}: connection refused"
    assert err.reason == "connection refused" and err.host == f"127.0.0.1:{refused_port}"
    assert isinstance(err.__cause__, requests.exceptions.ConnectionError)
    assert isinstance(err, NeurarchError)


def test_a_server_slower_than_the_timeout_is_a_timeout_error(canned: CannedServer) -> None:
    canned.hold = True
    with pytest.raises(PlanTimeoutError) as info:
        request_plan(small_graph(), api=canned.url, timeout=0.2)
    err = info.value
    assert str(err) == f"the plan service at {canned.host} did not answer within 0.2 seconds; try again later"
    assert err.timeout == 0.2
    assert isinstance(err, PlanConnectionError)  # a caller catching connection trouble gets it too
    assert isinstance(err.__cause__, requests.exceptions.Timeout)
    assert len(canned.requests) == 1  # the request did arrive; only the answer was late


def test_500_with_an_error_body_carries_the_servers_sentence(canned: CannedServer) -> None:
    canned.answer(500, {"error": "The planner failed on\nthis graph."})
    with pytest.raises(PlanStatusError) as info:
        request_plan(small_graph(), api=canned.url)
    err = info.value
    assert type(err) is PlanStatusError
    assert str(err) == f"the plan service at {canned.host} answered 500: The planner failed on this graph"
    assert (err.status_code, err.server_message) == (500, "The planner failed on this graph")


def test_an_html_error_page_names_the_status(canned: CannedServer) -> None:
    canned.answer(502, "<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
    with pytest.raises(PlanStatusError) as info:
        request_plan(small_graph(), api=canned.url)
    assert str(info.value) == f"the plan service at {canned.host} answered 502 Bad Gateway with no error message"
    assert info.value.server_message is None


def test_429_tells_the_user_to_set_the_key(canned: CannedServer) -> None:
    canned.answer(429, {"error": "Rate limit exceeded: 60 calls an hour."}, Retry_After="120")
    with pytest.raises(PlanRateLimitError) as info:
        request_plan(small_graph(), api=canned.url)
    err = info.value
    # the canned service listens on this machine: the user most likely started it, and can lift it
    own = "; a service you run yourself plans without a limit with `neurarch-trace serve --rate-limit 0`"
    assert str(err) == (
        f"the plan service at {canned.host} answered 429: Rate limit exceeded: 60 calls an hour; "
        "set NEURARCH_API_KEY to an API key the service issued to lift the limit, or retry in 2 minutes" + own
    )
    assert (err.status_code, err.retry_after) == (429, 120.0)
    assert isinstance(err, PlanStatusError)
    canned.answer(429, {"error": "Too many calls; set NEURARCH_API_KEY to a key."}, Retry_After="7200")
    with pytest.raises(PlanRateLimitError) as info:
        request_plan(small_graph(), api=canned.url)
    assert str(info.value) == (  # the service's own advice is not repeated
        f"the plan service at {canned.host} answered 429: Too many calls; set NEURARCH_API_KEY to a key, "
        "or retry in 2 hours" + own
    )
    canned.answer(429, {"error": "Rate limit exceeded."})
    with pytest.raises(PlanRateLimitError) as info:
        request_plan(small_graph(), api=canned.url, api_key="spent")
    assert str(info.value) == (
        f"the plan service at {canned.host} answered 429: Rate limit exceeded; "
        "the API key sent did not lift the limit; check NEURARCH_API_KEY" + own
    )


@pytest.mark.parametrize("host, here", [
    ("127.0.0.1:8765", True), ("localhost", True), ("LOCALHOST:80", True), ("[::1]:8000", True),
    ("127.1.2.3:1", True), ("www.neurarch.com", False), ("10.0.0.7:8765", False), ("[2001:db8::1]:443", False),
    ("127.example.com", False),
])
def test_a_rate_limit_hint_only_for_a_service_on_this_machine(host: str, here: bool) -> None:
    from neurarch_trace import plan_client
    assert plan_client._loopback(host) is here


def test_401_points_at_the_key(canned: CannedServer) -> None:
    canned.answer(401, {"error": "Unknown API key."})
    with pytest.raises(PlanStatusError) as info:
        request_plan(small_graph(), api=canned.url, api_key="wrong")
    assert str(info.value) == f"the plan service at {canned.host} answered 401: Unknown API key; check NEURARCH_API_KEY"


def test_a_redirect_is_not_followed(canned: CannedServer) -> None:
    canned.answer(301, b"", "text/plain", Location="https://www.neurarch.com/api/v1/plan")
    with pytest.raises(PlanStatusError) as info:
        request_plan(small_graph(), api=canned.url, api_key="secret")
    assert str(info.value) == (
        f"the plan service at {canned.host} answered 301, a redirect to "
        "https://www.neurarch.com/api/v1/plan; set NEURARCH_API to the address it points at"
    )
    assert info.value.location == "https://www.neurarch.com/api/v1/plan"
    assert len(canned.requests) == 1


@pytest.mark.parametrize(
    "body, content_type, what",
    [
        ("<!doctype html><title>Neurarch</title>", "text/html; charset=utf-8", "with an HTML page; "
         "the address may not be a plan service"),
        ("plain words", "text/plain",
         "with a body that is not JSON (text/plain); the address may not be a plan service"),
        ({"card": CARD}, "application/json", 'without a card (no string "text" in its JSON)'),
        ({"text": 42}, "application/json", 'without a card (no string "text" in its JSON)'),
        ([CARD], "application/json", "with JSON that is not an object (list)"),
        ({"text": CARD, "url": 7}, "application/json", 'with a "url" that is not a string'),
        ({"text": CARD, "plan": []}, "application/json", 'with a "plan" that is not an object'),
    ],
)
def test_a_malformed_answer_is_a_response_error(canned: CannedServer, body: Any, content_type: str, what: str) -> None:
    canned.answer(200, body, content_type)
    with pytest.raises(PlanResponseError) as info:
        request_plan(small_graph(), api=canned.url)
    assert str(info.value) == f"the plan service at {canned.host} answered 200 {what}"
    assert info.value.status_code == 200
    assert_one_line(info.value)


# ------------------------------------------------------------ against the reference service


def test_an_address_with_a_path_of_its_own_says_what_the_base_address_is(plan_server: str) -> None:
    # the reference service has no /api/api/v1/plan: it answers 404
    with pytest.raises(PlanStatusError) as info:
        request_plan(small_graph(), api=plan_server + "/api")
    assert info.value.status_code == 404
    assert str(info.value) == (
        f"the plan service at {api_host(plan_server)} answered 404: not found; is this a plan service (it has no "
        "/api/api/v1/plan)? NEURARCH_API is the service's base address, to which /api/v1/plan is added")


def test_reference_service_returns_a_card_and_plan(plan_server: str) -> None:
    answer = request_plan(small_graph(), api=plan_server, source={"kind": "file", "tool": user_agent()})
    lines = answer.text.rstrip("\n").split("\n")
    assert lines[0].startswith("+-") and lines[-1].startswith("+-")
    assert all(len(line) <= 68 for line in lines)
    assert answer.url is None and answer.share_error is None
    assert answer.blocked is False
    assert answer.plan["model"]["params"] == 4 * 2 + 2


def test_reference_service_reports_a_shape_blocker(plan_server: str) -> None:
    answer = request_plan(small_graph(in_features=8), api=plan_server)
    assert answer.blocked is True
    assert answer.plan["run"]["legal"] is False or answer.blockers


def test_reference_service_share_url_shows_the_same_card(plan_server: str) -> None:
    answer = request_plan(small_graph(), share=True, api=plan_server)
    assert answer.url and answer.share_error is None
    page = requests.get(answer.url, timeout=30)
    assert page.status_code == 200
    assert answer.text.strip() in _visible_text(page)


def _visible_text(page: requests.Response) -> str:
    """The card as a browser shows it: the page's text with HTML entities decoded."""
    import html

    return html.unescape(page.text)


def test_a_share_link_that_is_not_http_is_refused(canned: CannedServer) -> None:
    canned.answer(200, {"text": CARD, "url": "javascript:alert(1)"})
    answer = request_plan(small_graph(), share=True, api=canned.url)
    assert answer.url is None
    assert answer.share_error == "the service returned a share link that is not an http(s) URL ('javascript:alert(1)')"
    assert answer.text == CARD


@pytest.mark.parametrize("api, fault", [
    ("http://127.0.0.1:99999", "has a port that is not a number from 1 to 65535"),
    ("http://127.0.0.1:x", "has a port that is not a number from 1 to 65535"),
    ("http://127.0.0.1:0", "has a port that is not a number from 1 to 65535"),
    ("http://127.0.0.1:8000?x=1", "has a query or a fragment: give the service's base address, to which "
                                  "/api/v1/plan is added"),
    ("http://127.0.0.1:8000/#top", "has a query or a fragment: give the service's base address, to which "
                                   "/api/v1/plan is added"),
    ("http://[::1", "is not an http(s) URL: its host is malformed"),  # urlsplit raises ValueError
    ("http://exa mple.com", "is not an http(s) URL: it contains a space or a control character"),
    ("http://example.com/a\tb", "is not an http(s) URL: it contains a space or a control character"),
])
def test_a_bad_port_or_host_is_a_plan_error(api: str, fault: str) -> None:
    with pytest.raises(PlanError) as info:
        request_plan(small_graph(), api=api)
    assert type(info.value) is PlanError
    assert str(info.value) == (
        f"the plan service address {api!r} {fault}; "
        "set NEURARCH_API to one such as https://www.neurarch.com, or unset it"
    )


class _RawAnswer:
    """A one-connection server on loopback that reads the request and answers with ``send(conn)``."""

    def __init__(self, send) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

        def serve() -> None:
            conn, _ = self.sock.accept()
            try:
                conn.recv(1 << 20)  # the request (small)
                send(conn)
            except OSError:
                pass  # the client went away
            finally:
                conn.close()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(10)


_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


def test_an_answer_without_end_is_refused_past_its_size_limit() -> None:
    # a service that sends forever (a new-user pass: 10.5 GB read in 50 s): refused past 32 MiB
    def endless(conn) -> None:
        conn.sendall(_HEAD + b"\r\n" + b'{"text": "')
        while True:
            conn.sendall(b"x" * (1 << 20))

    server = _RawAnswer(endless)
    try:
        with pytest.raises(PlanResponseError, match=r"sent an answer over 32 MiB \(a plan is tens of kilobytes\)"):
            request_plan(small_graph(), api=server.url)
    finally:
        server.close()


def test_a_dribbling_answer_meets_the_timeout_for_the_whole_body() -> None:
    import time

    # one byte every 0.2 s of a 1,000-byte body: each piece comes within the timeout, the whole never
    def dribble(conn) -> None:
        conn.sendall(_HEAD + b"Content-Length: 1000\r\n\r\n")
        for _ in range(1000):
            conn.sendall(b" ")
            time.sleep(0.2)

    server = _RawAnswer(dribble)
    start = time.monotonic()
    try:
        with pytest.raises(PlanTimeoutError, match="did not answer within 1 seconds"):
            request_plan(small_graph(), api=server.url, timeout=1)
    finally:
        server.close()
    assert time.monotonic() - start < 30  # a bound against a hang, not a timing assertion


def test_an_answer_cut_short_is_one_line_naming_the_broken_connection() -> None:
    def cut(conn) -> None:
        conn.sendall(_HEAD + b"Content-Length: 1000\r\n\r\n" + b'{"text": "')

    server = _RawAnswer(cut)
    try:
        with pytest.raises(PlanConnectionError) as info:
            request_plan(small_graph(), api=server.url)
    finally:
        server.close()
    assert_one_line(info.value)
    assert str(info.value) == (f"the connection to the plan service at {server.url.removeprefix('http://')} broke "
                               "before the whole answer came; try again")
