"""The plan service on a real PostgreSQL server: replicas sharing one database.

The server: ``NEURARCH_TEST_POSTGRES_URL`` when set (any database the tests may create databases
in), else a private cluster this session makes with the installed ``initdb`` in a temporary
folder (as the ``postgres`` user when running as root, since PostgreSQL refuses root), on a free
loopback port, stopped at the end. Without PostgreSQL binaries the tests skip, unless
``NEURARCH_REQUIRE_POSTGRES=1`` (CI sets it), where they fail.

Replicas are real ``python -m neurarch_trace.server`` processes on their own ports, pointed at one
fresh database per test.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
psycopg = pytest.importorskip("psycopg")
import requests  # noqa: E402

DATA = Path(__file__).parent / "data"
PLAN = "/api/v1/plan"
REQUIRED = os.environ.get("NEURARCH_REQUIRE_POSTGRES") == "1"
_databases = itertools.count()


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.neurarch.json").read_text())


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PostgreSQL is required here (NEURARCH_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"no PostgreSQL: {reason}")


def _pg_bindir() -> Optional[Path]:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL server's ``postgres`` database, for creating test databases."""
    url = os.environ.get("NEURARCH_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    bindir = _pg_bindir()
    if bindir is None:
        _unavailable("no initdb found (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="neurarch-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL will not run as root
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    try:
        subprocess.run(as_user + [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                  "-E", "UTF8", "--no-sync"], check=True, capture_output=True, timeout=120)
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
        subprocess.run(as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                                  str(root / "log"), "-w", "-t", "60", "start"], check=True, capture_output=True,
                       timeout=90)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        log = (root / "log").read_text(errors="replace") if (root / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        detail = getattr(exc, "stderr", b"") or b""
        _unavailable(f"a private server did not start: {exc} {detail.decode(errors='replace')} {log}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the server, dropped after the test."""
    name = f"neurarch_test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = postgres_server.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Replica:
    """One ``python -m neurarch_trace.server`` process on a free port."""

    def __init__(self, db: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neurarch_trace.server", "--port", "0", "--db", db, "--log-level", "warning",
             *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        line = self._first_line(timeout=60)
        if b"neurarch plan service on http://" not in line:
            self.stop()
            pytest.fail(f"replica did not start: {line.decode(errors='replace')}")
        self.url = line.split(b" on ", 1)[1].split()[0].decode()

    def _first_line(self, timeout: float) -> bytes:
        deadline, buffered = time.monotonic() + timeout, b""
        while b"\n" not in buffered and time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.5)
            if ready:
                chunk = os.read(self.proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                buffered += chunk
        return buffered

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.stderr.close()


@pytest.fixture
def replicas(pg_url: str) -> Iterator[Any]:
    """``start(*args) -> Replica`` on the test's database; all are stopped after the test."""
    started: list[Replica] = []

    def start(*args: str) -> Replica:
        replica = Replica(pg_url, *args)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()


def share(base: str, name: str, **kwargs: Any) -> requests.Response:
    doc = load("mlp")
    doc["name"] = name
    return requests.post(base + PLAN, json={"model": doc, "share": True}, timeout=60, **kwargs)


def test_a_share_made_on_one_replica_is_served_by_the_other(replicas: Any) -> None:
    a, b = replicas("--rate-limit", "0"), replicas("--rate-limit", "0", "--public-url", "https://plans.example.com")
    made = share(a.url, "shared-across").json()
    share_id = made["url"].rsplit("/", 1)[1]
    assert made["url"] == f"{a.url}/p/{share_id}"
    served = requests.get(f"{b.url}/p/{share_id}.json", timeout=30).json()
    assert served["graph"] == {**load("mlp"), "name": "shared-across"}
    assert served["plan"] == made["plan"] and served["text"] == made["text"]
    page = requests.get(f"{b.url}/p/{share_id}", timeout=30)
    assert page.status_code == 200 and "shared-across" in page.text
    assert requests.get(f"{b.url}/p/{'Z' * 24}.json", timeout=30).json() == {"error": "not found"}
    again = share(b.url, "made-on-b").json()["url"]
    assert again.startswith("https://plans.example.com/p/")
    assert requests.get(f"{a.url}/p/{again.rsplit('/', 1)[1]}.json", timeout=30).json()["graph"]["name"] == "made-on-b"


def test_one_rate_limit_and_one_quota_span_both_replicas(replicas: Any) -> None:
    a, b = replicas("--rate-limit", "3"), replicas("--rate-limit", "3")
    body = {"model": load("mlp")}
    codes = [requests.post(server.url + PLAN, json=body, timeout=30).status_code for server in (a, b) * 3]
    assert codes == [200, 200, 200, 429, 429, 429]

    c, d = replicas("--rate-limit", "0", "--share-quota-mb", "0.006"), replicas("--rate-limit", "0",
                                                                                "--share-quota-mb", "0.006")
    answers = [share(server.url, f"quota-{i}").json() for i, server in enumerate((c, d) * 4)]
    stored = [a for a in answers if "url" in a]
    assert 0 < len(stored) < 8
    assert all("url" in a for a in answers[:len(stored)])
    assert all("share quota" in a["share_error"] for a in answers[len(stored):])


def test_kill_9_of_a_replica_loses_nothing_acknowledged(replicas: Any, pg_url: str) -> None:
    victim, survivor = replicas("--rate-limit", "0"), replicas("--rate-limit", "0")
    acknowledged: list[str] = []
    failed: list[str] = []

    def client(worker: int) -> None:
        for i in range(60):
            try:
                answer = share(victim.url, f"kill-{worker}-{i}")
            except requests.RequestException:
                failed.append(f"{worker}-{i}")
                return  # the victim is gone
            assert answer.status_code == 200, answer.text
            acknowledged.append(answer.json()["url"].rsplit("/", 1)[1])

    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(client, worker) for worker in range(6)]
        for _ in range(600):
            if len(acknowledged) >= 20:
                break
            time.sleep(0.01)
        victim.kill()
        for future in futures:
            future.result()
    assert len(acknowledged) >= 20 and failed  # it died with requests in flight
    for share_id in acknowledged:
        answer = requests.get(f"{survivor.url}/p/{share_id}.json", timeout=30)
        assert answer.status_code == 200, share_id
    with psycopg.connect(pg_url) as conn:
        stored = conn.execute("SELECT COUNT(*) FROM shares").fetchone()[0]
    assert stored >= len(acknowledged)


def test_the_in_process_service_runs_on_postgres(plan_server_factory: Any, pg_url: str) -> None:
    server = plan_server_factory(db_path=pg_url, rate_limit=2, share_ttl_s=3600.0)  # db_path: an alias of database_url
    assert server.db_path is None
    made = share(server, "in-process").json()["url"]
    assert requests.get(made + ".json", timeout=30).json()["graph"]["name"] == "in-process"
    assert requests.post(server + PLAN, json={"model": load("mlp")}, timeout=30).status_code == 200
    assert requests.post(server + PLAN, json={"model": load("mlp")}, timeout=30).status_code == 429
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT size, length(doc), expires - created FROM shares").fetchone()
    assert row[0] == row[1] and 3599 < row[2] < 3601
