"""Shared fixtures: the real plan service on a free loopback port, started and stopped per test.

As httpx's own tests do it: a uvicorn server runs on a thread in this process, serving the app
that :func:`neurarch_trace.server.create_app` builds; tests talk to it over real HTTP. The socket
is bound before the thread starts, so the port is known and never raced for.

    def test_something(plan_server):                  # defaults, db in tmp_path
        requests.post(plan_server + "/api/v1/plan", json={"model": graph})

    def test_limits(plan_server_factory):              # any Settings field
        url = plan_server_factory(rate_limit=2, api_keys=("k",))
        url.db_path, url.settings, url.app             # what the server was built with

Both yield the base URL (``http://127.0.0.1:PORT``, no trailing slash) as a ``str`` subclass that
also carries ``settings``, ``app``, ``db_path`` and the ``uvicorn.Server``. Skipped when the
``server`` extra is missing.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest
from canned_server import CannedServer

#: Seconds a server may take to start before the test fails.
START_TIMEOUT_S = 15.0


class ServerURL(str):
    """The base URL of a running test server, with what it was built from."""

    settings: Any
    app: Any
    db_path: Path
    server: Any


@pytest.fixture
def plan_server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerURL]]:
    """A function ``(**settings) -> ServerURL`` starting one server per call; all are stopped
    after the test. Unless given, ``db_path`` is a new file in ``tmp_path`` and ``public_url``
    the server's own address."""
    pytest.importorskip("uvicorn")
    server_pkg = pytest.importorskip("neurarch_trace.server")
    from neurarch_trace.server.transport import bind_socket, build_server
    running: List[Tuple[Any, threading.Thread, socket.socket]] = []
    counter = itertools.count()

    def start(**overrides: Any) -> ServerURL:
        sock = bind_socket("127.0.0.1", 0, backlog=128)  # as `serve` binds it: TCP_NODELAY on connections
        port = sock.getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        options = {"host": "127.0.0.1", "port": port, "public_url": base,
                   "db_path": tmp_path / f"shares-{next(counter)}.sqlite3"}
        options.update(overrides)
        settings = server_pkg.Settings(**options)
        app = server_pkg.create_app(settings)
        server = build_server(app, settings, log_level="warning")  # the same transport limits as `serve`
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread, sock))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail(f"the plan service did not start on {base}")
            time.sleep(0.01)
        url = ServerURL(base)
        url.settings = settings
        url.app = app
        url.db_path = settings.resolved_db_path()
        url.server = server
        return url

    yield start
    for server, _, _ in running:
        server.should_exit = True
    # uvicorn notices should_exit on its next tick and then sleeps 0.1 s before it shuts down
    # (uvicorn.Server.main_loop, shutdown): about 0.18 s a server, mostly asleep. Earlier tests'
    # servers, given a whole test to finish, are joined now; this one's by the next test or at
    # the end of the session (each test's database is its own, in its tmp_path)
    _join_stopped()
    _STOPPING.extend((thread, sock) for _, thread, sock in running)


#: ``(thread, socket)`` of servers told to stop and not yet joined.
_STOPPING: List[Tuple[threading.Thread, socket.socket]] = []


def _join_stopped() -> None:
    while _STOPPING:
        thread, sock = _STOPPING.pop()
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="session", autouse=True)
def _servers_joined_at_the_end() -> Iterator[None]:
    yield
    _join_stopped()


@pytest.fixture
def plan_server(plan_server_factory: Callable[..., ServerURL]) -> ServerURL:
    """One plan service with default settings (60 anonymous calls an hour, no keys)."""
    return plan_server_factory()


# --- the plan client's misbehaving servers (tests/canned_server.py) ----------------------------


@pytest.fixture
def canned() -> Iterator[CannedServer]:
    server = CannedServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting is refused, and no one else takes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


#: Test files that are slow as a whole (a real browser, notebooks run in a kernel, scale tests,
#: PostgreSQL replicas in their own processes):
#: marked here rather than in each file.
SLOW_FILES = {"test_browser.py", "test_notebooks.py", "test_scale.py", "test_server_postgres.py"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> Optional[bool]:
    """The fast loop (``-m "not slow"``) does not import the files that are slow as a whole:
    importing Jupyter's packages at collection alone took 3 of its seconds."""
    if collection_path.name in SLOW_FILES and (config.getoption("markexpr") or "").strip() == "not slow":
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own NEURARCH_API / NEURARCH_API_KEY must not leak into these tests."""
    monkeypatch.delenv("NEURARCH_API", raising=False)
    monkeypatch.delenv("NEURARCH_API_KEY", raising=False)
