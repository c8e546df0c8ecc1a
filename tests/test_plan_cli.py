"""The plan flags and ``neurarch-trace plan``, run as the real command in a subprocess.

``NEURARCH_API`` points the command at a loopback server: the reference service (conftest's
``plan_server`` fixtures) or a misbehaving standard-library one. Every test pins the exit code,
stdout exactly, and stderr line by line, and checks the graph file is still on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest
import requests
from canned_server import CARD, CannedServer, small_graph

from neurarch_trace._version import __version__
from neurarch_trace.plan_cli import run_plan
from neurarch_trace.plan_client import request_plan, user_agent

REPO = Path(__file__).resolve().parents[1]
RESNET = REPO / "examples" / "models" / "resnet.py"
needs_resnet = pytest.mark.skipif(
    not RESNET.exists(), reason="examples/models/resnet.py (the lead's example model) is not there yet"
)

TINY_MODEL = '''
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
'''



def file_source(name: str) -> dict:
    """The ``source`` block ``neurarch-trace plan NAME`` sends (the file's base name heads the card)."""
    return {"kind": "file", "target": name, "tool": f"neurarch-trace/{__version__}"}


def run_cli(args: list[str], cwd: Path, *, api: Optional[str] = None,
            key: Optional[str] = None) -> subprocess.CompletedProcess:
    """``python -m neurarch_trace ARGS`` in ``cwd`` with only the NEURARCH_* variables given here."""
    env = {k: v for k, v in os.environ.items() if k not in ("NEURARCH_API", "NEURARCH_API_KEY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if api is not None:
        env["NEURARCH_API"] = api
    if key is not None:
        env["NEURARCH_API_KEY"] = key
    # The bound is a safety net against a hang, not an assertion about speed.
    return subprocess.run([sys.executable, "-m", "neurarch_trace", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def stderr_lines(done: subprocess.CompletedProcess) -> list[str]:
    assert done.stderr.endswith("\n") or done.stderr == ""
    return done.stderr.splitlines()


def write_json(path: Path, value: object) -> bytes:
    data = json.dumps(value, indent=2).encode("utf-8")
    path.write_bytes(data)
    return data


def notice(host: str, *, layers: int = 1, base_layers: Optional[int] = None, share: bool = False) -> str:
    plural = lambda n: f"{n} layer{'s' if n != 1 else ''}"  # noqa: E731
    what = f"the graph ({plural(layers)})"
    if base_layers is not None:
        what += f" and the base graph ({plural(base_layers)})"
    if share:
        return f"Sending {what} to {host} for the plan and a public share link (anyone with the link can open it)."
    return f"Sending {what} to {host} for the plan; add --share for a public link."


def host_of(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


@pytest.fixture
def small_file(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "small.neurarch.json"
    return path, write_json(path, small_graph())


@pytest.fixture
def listening_socket() -> Iterator[socket.socket]:
    """A raw TCP server that listens and never answers: the kernel completes every connection
    attempt into the backlog, so :func:`accepted_connections` counts them after the fact."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield sock
    finally:
        sock.close()


def accepted_connections(sock: socket.socket) -> int:
    sock.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def url_of(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}/"


# ------------------------------------------------------------ re-plan against the reference


def test_replan_prints_the_card_and_nothing_else(plan_server: str, tmp_path: Path, small_file) -> None:
    path, data = small_file
    expected = request_plan(small_graph(), api=plan_server, source=file_source(path.name)).text
    done = run_cli(["plan", path.name], tmp_path, api=plan_server + "/")
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected if expected.endswith("\n") else expected + "\n"
    assert stderr_lines(done) == [notice(host_of(plan_server))]
    assert path.read_bytes() == data


def test_a_token_length_for_a_model_without_tokens_is_a_note(plan_server: str, tmp_path: Path) -> None:
    # the reference service sizes a token model's length; the small graph takes a vector: the card
    # is the one without the flags, and one line says they changed nothing
    path = tmp_path / "small.neurarch.json"
    write_json(path, small_graph())
    plain = run_cli(["plan", path.name], tmp_path, api=plan_server)
    done = run_cli(["plan", path.name, "--seq-len", "100", "--context", "100"], tmp_path, api=plan_server)
    assert (done.returncode, done.stdout) == (0, plain.stdout)
    assert stderr_lines(done)[1:] == [
        "neurarch-trace: note: --seq-len and --context size a token model; this model takes no tokens: they "
        "change nothing on the card"]
    done = run_cli(["plan", path.name, "--seq-len", "100"], tmp_path, api=plan_server)
    assert stderr_lines(done)[1:] == [
        "neurarch-trace: note: --seq-len sizes a token model; this model takes no tokens: it changes nothing "
        "on the card"]


def test_replan_share_prints_a_link_that_shows_the_same_card(plan_server: str, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    done = run_cli(["plan", path.name, "--share"], tmp_path, api=plan_server)
    assert done.returncode == 0, done.stderr
    *card, last = done.stdout.splitlines()
    assert last.startswith("Share: ") and card
    assert done.stdout == "\n".join(card) + "\n" + last + "\n"
    assert stderr_lines(done) == [notice(host_of(plan_server), share=True)]
    page = requests.get(last[len("Share: "):], timeout=30)
    assert page.status_code == 200
    import html

    assert "\n".join(card) in html.unescape(page.text)


def test_replan_with_base_adds_the_diff(plan_server: str, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    bigger = small_graph()
    bigger["components"][1]["params"]["outFeatures"] = 3
    bigger["components"][1]["outputShape"] = [3]
    bigger["components"][2]["inputShape"] = [3]
    write_json(tmp_path / "old.neurarch.json", bigger)
    plain = run_cli(["plan", path.name], tmp_path, api=plan_server)
    done = run_cli(["plan", path.name, "--base", "old.neurarch.json"], tmp_path, api=plan_server)
    assert (plain.returncode, done.returncode) == (0, 0), done.stderr
    assert stderr_lines(done) == [notice(host_of(plan_server), base_layers=1)]
    expected = request_plan(small_graph(), base=bigger, api=plan_server, source=file_source(path.name)).text
    assert done.stdout == (expected if expected.endswith("\n") else expected + "\n")
    assert done.stdout != plain.stdout
    added = [line for line in done.stdout.splitlines() if line not in plain.stdout.splitlines()]
    assert any(line.startswith("| Diff vs base") for line in added), added
    assert "| Params          -5 (15 -> 10)" in done.stdout  # 4*3+3 weights and biases -> 4*2+2


def test_fail_on_block_exits_2_on_a_blocked_graph(plan_server: str, tmp_path: Path) -> None:
    path = tmp_path / "blocked.neurarch.json"
    data = write_json(path, small_graph(in_features=8))  # hand edit: fc expects 8 features, gets 4
    answer = request_plan(small_graph(in_features=8), api=plan_server, source=file_source(path.name))
    assert answer.blocked is True
    done = run_cli(["plan", path.name, "--fail-on-block"], tmp_path, api=plan_server)
    assert done.returncode == 2
    assert done.stdout == (answer.text if answer.text.endswith("\n") else answer.text + "\n")
    n = len(answer.blockers)
    what = f"{n} blocker{'s' if n != 1 else ''}" if n else "that the graph would not run"
    assert stderr_lines(done) == [
        notice(host_of(plan_server)),
        f"neurarch-trace: the plan reports {what}; exit 2 (--fail-on-block)",
    ]
    assert path.read_bytes() == data
    without_flag = run_cli(["plan", path.name], tmp_path, api=plan_server)
    assert (without_flag.returncode, without_flag.stdout) == (0, done.stdout)


def test_fail_on_block_exits_0_on_a_clean_graph(plan_server: str, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    done = run_cli(["plan", path.name, "--fail-on-block"], tmp_path, api=plan_server)
    assert done.returncode == 0, done.stderr
    assert stderr_lines(done) == [notice(host_of(plan_server))]
    assert done.stdout.startswith("+-")


def test_the_bearer_key_lifts_a_rate_limit_of_one(plan_server_factory, tmp_path: Path, small_file) -> None:
    path, data = small_file
    url = plan_server_factory(rate_limit=1, api_keys=["k-test"])
    first = run_cli(["plan", path.name], tmp_path, api=url)
    assert first.returncode == 0, first.stderr
    second = run_cli(["plan", path.name], tmp_path, api=url)
    assert second.returncode == 1 and second.stdout == ""
    [sent, error] = stderr_lines(second)
    assert sent == notice(host_of(url))
    # The service's sentence already names NEURARCH_API_KEY; the client adds the Retry-After wait
    # (minutes left of the hour window, whatever they are) and where the graph is.
    assert re.fullmatch(
        re.escape(f"neurarch-trace: the plan service at {host_of(url)} answered 429: rate limit reached: "
                  "anonymous callers get 1 plan per hour per IP; set NEURARCH_API_KEY to a key of this "
                  "service, or retry in ") + r"\d+ minutes?"
        # a service on this machine: the user most likely started it, and can turn the limit off
        + re.escape("; a service you run yourself plans without a limit with `neurarch-trace serve "
                    "--rate-limit 0`; the graph is still at small.neurarch.json"),
        error,
    ), error
    for _ in range(2):
        keyed = run_cli(["plan", path.name], tmp_path, api=url, key="k-test")
        assert keyed.returncode == 0, keyed.stderr
        assert keyed.stdout == first.stdout
    assert path.read_bytes() == data


# ------------------------------------------------------------------------ failure injection


def assert_failed_cleanly(done: subprocess.CompletedProcess, host: str, message: str,
                          path: Path, data: bytes) -> None:
    assert done.returncode == 1
    assert done.stdout == ""
    assert stderr_lines(done) == [
        notice(host), f"neurarch-trace: {message}; the graph is still at {path.name}",
    ]
    assert path.read_bytes() == data


def test_nothing_listening(refused_port: int, tmp_path: Path, small_file) -> None:
    path, data = small_file
    done = run_cli(["plan", path.name], tmp_path, api=f"http://127.0.0.1:{refused_port}")
    host = f"127.0.0.1:{refused_port}"
    assert_failed_cleanly(done, host, f"could not connect to the plan service at {host}: connection refused",
                          path, data)


def test_500_with_an_error_body(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, data = small_file
    canned.answer(500, {"error": "The planner crashed on this graph."})
    done = run_cli(["plan", path.name, "--share"], tmp_path, api=canned.url)
    assert done.returncode == 1 and done.stdout == ""
    assert stderr_lines(done) == [
        notice(canned.host, share=True),
        f"neurarch-trace: the plan service at {canned.host} answered 500: The planner crashed on this "
        "graph; the graph is still at small.neurarch.json",
    ]
    assert path.read_bytes() == data


def test_an_html_answer(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, data = small_file
    canned.answer(200, "<!doctype html><html><body>Welcome</body></html>", "text/html")
    done = run_cli(["plan", path.name], tmp_path, api=canned.url)
    assert_failed_cleanly(done, canned.host, f"the plan service at {canned.host} answered 200 with an HTML "
                          "page; the address may not be a plan service", path, data)


def test_an_html_500(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, data = small_file
    canned.answer(500, "<html><h1>Internal Server Error</h1></html>", "text/html")
    done = run_cli(["plan", path.name], tmp_path, api=canned.url)
    assert_failed_cleanly(done, canned.host, f"the plan service at {canned.host} answered 500 Internal "
                          "Server Error with no error message", path, data)


def test_json_without_text(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, data = small_file
    canned.answer(200, {"card": CARD, "plan": {"run": {"legal": True, "blockers": []}}})
    done = run_cli(["plan", path.name], tmp_path, api=canned.url)
    assert_failed_cleanly(done, canned.host, f"the plan service at {canned.host} answered 200 without a "
                          'card (no string "text" in its JSON)', path, data)


def test_share_asked_but_no_link_returned(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    canned.answer(200, {"text": CARD, "share_error": "Sharing is turned off on this deployment."})
    done = run_cli(["plan", path.name, "--share"], tmp_path, api=canned.url)
    assert done.returncode == 0
    assert done.stdout == CARD
    assert stderr_lines(done) == [
        notice(canned.host, share=True),
        "neurarch-trace: no share link: Sharing is turned off on this deployment.",
    ]


def test_the_card_is_printed_verbatim_and_share_comes_last(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    card = "+--+\n|  trailing spaces kept   |\n\n+--+"  # no final newline: one is added, nothing else
    canned.answer(200, {"text": card, "url": "https://plans.example/p/abc"})
    done = run_cli(["plan", path.name, "--share"], tmp_path, api=canned.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout == card + "\nShare: https://plans.example/p/abc\n"
    [req] = canned.requests
    assert req["body"] == {"model": small_graph(), "share": True, "source": file_source("small.neurarch.json")}


def test_fail_on_block_without_a_verdict_is_an_error(canned: CannedServer, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    canned.answer(200, {"text": CARD})
    done = run_cli(["plan", path.name, "--fail-on-block"], tmp_path, api=canned.url)
    assert done.returncode == 1
    assert done.stdout == CARD
    assert stderr_lines(done) == [
        notice(canned.host),
        "neurarch-trace: the plan carries no plan.run verdict, so --fail-on-block cannot tell whether "
        "the graph is blocked",
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "--base: graph file old.neurarch.json does not exist"),
        ("{not json", "--base: graph file old.neurarch.json is not JSON (Expecting property name enclosed "
                      "in double quotes at line 1)"),
        ('{"components": []}', "--base: graph file old.neurarch.json is not a .neurarch.json graph: "
                               "'connections' is missing or not an array"),
    ],
)
def test_a_bad_base_file_is_one_line_and_nothing_is_sent(
    listening_socket: socket.socket, tmp_path: Path, small_file, content: Optional[str], message: str
) -> None:
    path, _ = small_file
    if content is not None:
        (tmp_path / "old.neurarch.json").write_text(content)
    done = run_cli(["plan", path.name, "--base", "old.neurarch.json"], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [f"neurarch-trace: {message}"]
    assert accepted_connections(listening_socket) == 0


def test_a_missing_graph_file_is_one_line_and_nothing_is_sent(listening_socket: socket.socket, tmp_path: Path) -> None:
    done = run_cli(["plan", "nope.neurarch.json", "--share"], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == ["neurarch-trace: graph file nope.neurarch.json does not exist"]
    assert accepted_connections(listening_socket) == 0


@pytest.mark.parametrize("stdout, reason", [("full", "No space left on device"),
                                            ("closed", "stdout is closed")])  # plan takes no -o
def test_a_card_stdout_cannot_take_is_one_line(plan_server: str, tmp_path: Path, small_file, stdout: str,
                                               reason: str) -> None:
    # /dev/full refuses every write (ENOSPC); a closed stdout (>&-) leaves Python no sys.stdout
    path, data = small_file
    env = {k: v for k, v in os.environ.items() if k != "NEURARCH_API_KEY"}
    env.update(NEURARCH_API=plan_server, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "neurarch_trace", "plan", path.name], cwd=tmp_path, env=env,
                              stdout=full if stdout == "full" else None, stderr=subprocess.PIPE, text=True,
                              timeout=300, preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None)
    assert done.returncode == 1
    assert stderr_lines(done) == [notice(host_of(plan_server)),
                                  f"neurarch-trace: cannot write the card to stdout: {reason}"]
    assert path.read_bytes() == data


def test_a_bad_neurarch_api_is_one_line_and_nothing_is_sent(tmp_path: Path, small_file) -> None:
    path, _ = small_file
    done = run_cli(["plan", path.name], tmp_path, api="localhost:8000")
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [
        "neurarch-trace: NEURARCH_API 'localhost:8000' is not an http(s) URL; set NEURARCH_API to one "
        "such as https://www.neurarch.com, or unset it"
    ]


@pytest.mark.parametrize("gpu", ["H100x0", "rtx 4090 x 00", "A100×0"])
def test_a_gpu_count_of_0_is_one_line_and_nothing_is_sent(
    listening_socket: socket.socket, tmp_path: Path, small_file, gpu: str
) -> None:
    path, _ = small_file
    done = run_cli(["plan", path.name, "--gpu", gpu], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [
        f"neurarch-trace: argument --gpu: {gpu!r} asks for 0 cards: give 1 or more after the x, e.g. H100x8 "
        "(see neurarch-trace plan --help)"
    ]
    assert accepted_connections(listening_socket) == 0


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--gpu", "H100x65", "argument --gpu: 'H100x65' asks for 65 cards; a plan uses 1 to 64 (eight 8-GPU nodes): "
                         "give fewer after the x, e.g. H100x64"),
    ("--usd-per-hour", "123456", "argument --usd-per-hour: $123,456 per GPU-hour is more than the plan API takes "
                                 "(at most $10,000); give the price of one GPU for one hour"),
    ("--gpu", "L4x160", "argument --gpu: 'L4x160' asks for 160 cards; a plan uses 1 to 64 (eight 8-GPU nodes): "
                        "give fewer after the x, e.g. L4x64"),
    ("--gpu", "H100x-1", "argument --gpu: 'H100x-1' asks for a negative number of cards: give 1 to 64 after the x, "
                         "e.g. H100x8"),
])
def test_a_gpu_count_or_price_beyond_the_api_is_one_line_and_nothing_is_sent(
    listening_socket: socket.socket, tmp_path: Path, small_file, option: str, value: str, said: str
) -> None:
    # a new-user pass: both were refused only by the service, after the graph had been sent
    path, _ = small_file
    done = run_cli(["plan", path.name, "--gpu", "RTX-4090", option, value], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [f"neurarch-trace: {said} (see neurarch-trace plan --help)"]
    assert accepted_connections(listening_socket) == 0


@pytest.mark.parametrize(("gpu", "said"), [
    ("H100x", "'H100x' has no count after the x: give one, e.g. H100x8, or the card alone"),
    ("A100 ×", "'A100 ×' has no count after the ×: give one, e.g. A100x8, or the card alone"),
    ("H100x8x2", "'H100x8x2' gives two counts: give the card once, with the number of cards after the x, "
                 "e.g. H100x8"),
    ("2x", "'2x' names no card: give one with the count, e.g. 2x H100 or H100x2"),
    ("0x", "'0x' names no card: give one with the count, e.g. 8x H100 or H100x8"),
    ("H100 x 8 x", "'H100 x 8 x' ends in an x with nothing after it: leave it out, e.g. H100 x 8"),
    ("8x H100x2", "'8x H100x2' gives two counts: give the card once, with the number of cards after the x, "
                  "e.g. H100x8"),
    ("rtx 4090 x 2 x 2", "'rtx 4090 x 2 x 2' gives two counts: give the card once, with the number of cards "
                         "after the x, e.g. rtx 4090x8"),
])
def test_a_gpu_count_missing_or_given_twice_is_one_line_and_nothing_is_sent(
    listening_socket: socket.socket, tmp_path: Path, small_file, gpu: str, said: str
) -> None:
    # a new-user pass: both reached the service, after the trace, as "unknown GPU"
    path, _ = small_file
    done = run_cli(["plan", path.name, "--gpu", gpu], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [f"neurarch-trace: argument --gpu: {said} (see neurarch-trace plan --help)"]
    assert accepted_connections(listening_socket) == 0


@pytest.mark.parametrize("gpu", ["rtx 4090", "RTX4090", "GeForce RTX 4090", "RTX-4090", "rtx"])
def test_the_x_of_rtx_is_a_name_not_a_count(gpu: str) -> None:
    from neurarch_trace.plan_client import check_plan_options, gpu_count
    from neurarch_trace.plan_options import _gpu

    # "rtx 4090" was refused as 4,090 cards of "rt", before the service, which knows the card
    assert gpu_count(gpu) is None
    assert _gpu(gpu) == gpu
    check_plan_options({"gpu": gpu})
    assert [gpu_count(f"{gpu}{tail}") for tail in ("x2", " x 2", "*3", "\u00d74")] == [2, 2, 3, 4]


def test_a_card_written_as_its_family_reaches_the_service_and_is_planned(
    plan_server: str, tmp_path: Path, small_file
) -> None:
    path, _ = small_file
    for gpu in ("rtx 4090", "RTX4090 x 2"):
        done = run_cli(["plan", path.name, "--gpu", gpu], tmp_path, api=plan_server)
        assert done.returncode == 0, done.stderr
        assert "RTX-4090 24 GB" in done.stdout
    # a count written first, as the card writes a cluster, is the same request as H100x2
    first, last = (run_cli(["plan", path.name, "--gpu", gpu], tmp_path, api=plan_server)
                   for gpu in ("2x H100", "H100x2"))
    assert first.returncode == last.returncode == 0, first.stderr
    assert "2x H100 80 GB" in first.stdout and first.stdout == last.stdout


def test_a_count_written_first_is_moved_after_the_name() -> None:
    from neurarch_trace.plan_client import gpu_count, name_first
    from neurarch_trace.planner.gpus import parse_gpu

    assert [name_first(g) for g in ("8x H100", "8xH100", "2 \u00d7 RTX-4090", "2*a100-80", "H100x8", "4090")] == [
        "H100x8", "H100x8", "RTX-4090x2", "a100-80x2", "H100x8", "4090"]
    assert gpu_count("8x H100") == 8 and gpu_count("2x rtx 4090") == 2
    for gpu in ("8x H100", "2x RTX-4090", "4 * A100-80"):
        assert parse_gpu(gpu) == parse_gpu(name_first(gpu))
        assert parse_gpu(gpu).gpus == int(gpu[0])


def test_the_command_lines_limits_are_the_services() -> None:
    from neurarch_trace import plan_client, plan_options
    from neurarch_trace.planner.gpus import MAX_GPUS
    from neurarch_trace.server.schemas import PlanRequest

    assert plan_client.MAX_GPUS == MAX_GPUS
    limits = {type(m).__name__: m for m in PlanRequest.model_fields["usd_per_hour"].metadata}
    assert plan_client.MAX_USD_PER_HOUR == limits["Le"].le
    # and Python's plan client (the magic's r.request_plan too) refuses both before sending
    for options in ({"gpu": "H100x65"}, {"gpu": "H100", "usd_per_hour": 10_001.0}):
        with pytest.raises(ValueError, match="at most|1 to 64"):
            plan_client.check_plan_options(options)
    tokens = next(m.le for m in PlanRequest.model_fields["seq_len"].metadata if hasattr(m, "le"))
    assert plan_options.MAX_TOKENS == tokens


def test_plan_usage_error_is_one_line_exit_1(tmp_path: Path) -> None:
    done = run_cli(["plan"], tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [
        "neurarch-trace: the following arguments are required: FILE.neurarch.json "
        "(see neurarch-trace plan --help)"
    ]


# ------------------------------------------------------------------- privacy (no flag, no send)


def test_run_plan_sends_nothing_without_plan_or_share(canned: CannedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURARCH_API", canned.url)
    args = argparse.Namespace(plan=False, share=False, base=None, fail_on_block=False, output=None)
    assert run_plan(args, small_graph(), "x.neurarch.json", target="m.py:M", inputs=["1,4"], base=None) == 0
    assert canned.requests == []


@pytest.fixture
def tiny_model(tmp_path: Path) -> str:
    (tmp_path / "tiny.py").write_text(TINY_MODEL)
    return "tiny.py:Tiny"


@pytest.mark.slow
def test_without_plan_flags_no_connection_is_attempted(
    listening_socket: socket.socket, tmp_path: Path, tiny_model: str
) -> None:
    done = run_cli([tiny_model, "--input", "1,4", "-o", "tiny.neurarch.json"], tmp_path,
                   api=url_of(listening_socket), key="k-secret")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert (tmp_path / "tiny.neurarch.json").exists()
    assert not any(line.startswith("Sending") for line in stderr_lines(done))
    assert accepted_connections(listening_socket) == 0


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--plan", "--share"])
def test_stdout_output_cannot_be_combined_with_plan(
    listening_socket: socket.socket, tmp_path: Path, tiny_model: str, flag: str
) -> None:
    done = run_cli([tiny_model, "--input", "1,4", "-o", "-", flag], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [
        f"neurarch-trace: -o - cannot be combined with {flag}: stdout carries the card; "
        "write the graph to a file with -o FILE"
    ]
    assert accepted_connections(listening_socket) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--base", "old.neurarch.json"], "--base needs --plan or --share: it is what the plan's diff compares to"),
        (["--fail-on-block"], "--fail-on-block needs --plan or --share: it reads the plan's verdict"),
    ],
)
def test_plan_only_flags_without_plan_are_refused_before_tracing(
    listening_socket: socket.socket, tmp_path: Path, tiny_model: str, extra: list[str], message: str
) -> None:
    done = run_cli([tiny_model, "--input", "1,4", *extra], tmp_path, api=url_of(listening_socket))
    assert (done.returncode, done.stdout) == (1, "")
    assert stderr_lines(done) == [f"neurarch-trace: {message}"]
    assert list(tmp_path.glob("*.neurarch.json")) == []
    assert accepted_connections(listening_socket) == 0


# ---------------------------------------------------------------------- trace, then plan


@pytest.mark.slow
def test_trace_then_plan_sends_the_source_block(canned: CannedServer, tmp_path: Path, tiny_model: str) -> None:
    canned.answer(200, {"text": CARD, "plan": {"run": {"legal": True, "blockers": []}}})
    done = run_cli([tiny_model, "--input", "1,4", "--plan", "--fail-on-block"], tmp_path, api=canned.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CARD
    written = json.loads((tmp_path / "Tiny.neurarch.json").read_text())
    [req] = canned.requests
    assert req["body"] == {
        "model": written,
        "share": False,
        "source": {"kind": "trace", "target": "tiny.py:Tiny", "input": "1,4", "tool": user_agent()},
    }
    lines = stderr_lines(done)
    assert lines[-1] == notice(canned.host, layers=1)
    assert any(line.startswith("wrote Tiny.neurarch.json") for line in lines[:-1])


@pytest.mark.slow
def test_trace_then_a_failed_plan_leaves_the_graph_on_disk(refused_port: int, tmp_path: Path, tiny_model: str) -> None:
    done = run_cli([tiny_model, "--input", "1,4", "--share", "-o", "out.neurarch.json"], tmp_path,
                   api=f"http://127.0.0.1:{refused_port}")
    host = f"127.0.0.1:{refused_port}"
    assert (done.returncode, done.stdout) == (1, "")
    lines = stderr_lines(done)
    assert lines[-2:] == [
        notice(host, share=True),
        f"neurarch-trace: could not connect to the plan service at {host}: connection refused; "
        "the graph is still at out.neurarch.json",
    ]
    assert any(line.startswith("wrote out.neurarch.json") for line in lines[:-2])
    assert json.loads((tmp_path / "out.neurarch.json").read_text())["components"]


@needs_resnet
@pytest.mark.slow
def test_resnet_trace_plan_share_against_the_reference(plan_server: str, tmp_path: Path) -> None:
    target = f"{RESNET}:ResNet18"
    done = run_cli([target, "--input", "1,3,224,224", "--plan", "--share"], tmp_path, api=plan_server)
    assert done.returncode == 0, done.stderr
    *card, last = done.stdout.splitlines()
    assert card[0].startswith("+-") and card[-1].startswith("+-")
    assert last.startswith("Share: http")
    graph = json.loads((tmp_path / "ResNet18.neurarch.json").read_text())
    layers = sum(1 for c in graph["components"] if c["type"] not in ("input", "output"))
    lines = stderr_lines(done)
    assert lines[-1] == notice(host_of(plan_server), layers=layers, share=True)
    assert any(line.startswith("wrote ResNet18.neurarch.json") for line in lines[:-1])
    page = requests.get(last[len("Share: "):], timeout=30)
    assert page.status_code == 200
    import html

    assert "\n".join(card) in html.unescape(page.text)


def test_verbose_adds_the_traceback_before_the_one_line(refused_port: int, tmp_path: Path, small_file) -> None:
    path, _ = small_file
    host = f"127.0.0.1:{refused_port}"
    done = run_cli(["plan", path.name, "--verbose"], tmp_path, api=f"http://{host}")
    assert (done.returncode, done.stdout) == (1, "")
    lines = stderr_lines(done)
    assert lines[0] == notice(host)
    assert "Traceback (most recent call last):" in lines
    assert any("requests.exceptions.ConnectionError" in line for line in lines)
    assert lines[-1] == (f"neurarch-trace: could not connect to the plan service at {host}: connection refused; "
                         "the graph is still at small.neurarch.json")


def test_seq_len_and_attention_reach_the_service(canned: CannedServer, tmp_path: Path) -> None:
    path = tmp_path / "small.neurarch.json"
    path.write_text(json.dumps(small_graph()))
    canned.answer(200, {"text": CARD})
    proc = subprocess.run(
        [sys.executable, "-m", "neurarch_trace", "plan", str(path), "--seq-len", "2048", "--attention", "eager"],
        capture_output=True, text=True, env={**os.environ, "NEURARCH_API": canned.url}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    body = canned.requests[-1]["body"]
    assert (body["seq_len"], body["attention"]) == (2048, "eager")
    proc = subprocess.run(
        [sys.executable, "-m", "neurarch_trace", "plan", str(path), "--seq-len", "0"],
        capture_output=True, text=True, env={**os.environ, "NEURARCH_API": canned.url}, timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "0 is not a positive number of tokens" in proc.stderr


@pytest.mark.slow
def test_seq_len_without_plan_is_refused_before_tracing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "neurarch_trace", f"{RESNET}:ResNet18", "--input", "1,3,32,32", "--seq-len", "64"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr == "neurarch-trace: --seq-len needs --plan or --share: it sizes the plan\n"
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_planning_says_where_the_graph_is(tmp_path: Path, listening_socket) -> None:
    # a new-user pass: Ctrl-C while waiting for the plan said "nothing was written" after "wrote ..."
    import signal
    import time

    (tmp_path / "tiny.py").write_text(TINY_MODEL)
    env = {k: v for k, v in os.environ.items() if k not in ("NEURARCH_API", "NEURARCH_API_KEY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["NEURARCH_API"] = url_of(listening_socket)
    proc = subprocess.Popen([sys.executable, "-m", "neurarch_trace", "tiny.py:Tiny", "--input", "1,4", "-o",
                             "t.neurarch.json", "--plan"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # until the plan is on its way (the service never answers)
        lines.append(line)
        if line.startswith("Sending the graph"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(60) == 1
    assert rest.splitlines()[-1] == "neurarch-trace: interrupted while planning; the graph is still at t.neurarch.json"
    assert json.loads((tmp_path / "t.neurarch.json").read_text())["name"] == "Tiny"
