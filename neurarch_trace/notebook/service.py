"""A plan service on loopback, inside the notebook's kernel, so plans never leave the machine.

    from neurarch_trace.notebook.service import start_plan_service
    service = start_plan_service()        # NEURARCH_API now points at it, for this kernel
    %neurarch model --input 1,3,224,224 --plan --share
    service.stop()                        # or let it stop with the kernel

The service is the reference one (:func:`neurarch_trace.server.create_app`, the same as
``neurarch-trace serve``) run by uvicorn on a daemon thread of the kernel: it lives exactly as long
as the kernel (a restart or shutdown ends it; "Run All" never stops it halfway), and it needs the
``server`` extra's packages (FastAPI, uvicorn), which the ``notebook`` extra brings.

``NEURARCH_API`` is set to the loopback address as soon as the port is bound, before the service
starts: if the start fails, plans in this kernel fail to connect to loopback instead of falling
through to a remote host. Share links start with ``public_url`` when given (Colab: the address its
proxy gives the port), else with the loopback address.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from neurarch_trace.errors import NeurarchError
from neurarch_trace.text import install_hint

__all__ = ["PlanService", "start_plan_service"]

#: Seconds the service may take to start.
START_TIMEOUT_S = 30.0


class PlanService:
    """A running service: ``url`` (``http://127.0.0.1:PORT``), ``port``, ``public_url``, ``db_path``."""

    def __init__(self, server: Any, thread: threading.Thread, sock: socket.socket, url: str,
                 public_url: str, db_path: Path) -> None:
        self._server = server
        self._thread = thread
        self._sock = sock
        self.url = url
        self.port = sock.getsockname()[1]
        self.public_url = public_url
        self.db_path = db_path

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (plans in this kernel then fail to connect; nothing falls through)."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __repr__(self) -> str:
        return f"<PlanService {self.url} {'running' if self.running else 'stopped'}>"


def _bind() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def start_plan_service(
    *,
    public_url: None | str | Callable[[int], str] = None,
    db_path: Path | None = None,
    set_env: bool = True,
) -> PlanService:
    """Start the reference plan service on a free loopback port, in this process, and (with
    ``set_env``) point ``NEURARCH_API`` at it.

    Args:
        public_url: where share links start: a URL, or a function of the port returning one
            (behind a proxy, as on Colab); default the loopback address.
        db_path: the SQLite file for shares; default a new file in a temporary folder.

    Raises:
        NeurarchError: the server extra's packages are missing, or the service did not start
            within :data:`START_TIMEOUT_S` seconds. ``NEURARCH_API`` already points at the
            loopback port then, so nothing falls through to a remote host.
    """
    sock = _bind()
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    if set_env:
        os.environ["NEURARCH_API"] = url
    try:
        import uvicorn

        from neurarch_trace.server import Settings, create_app
    except ImportError as exc:
        sock.close()
        raise NeurarchError(
            f"the local plan service needs FastAPI and uvicorn ({exc.name} is missing): "
            f"{install_hint('fastapi uvicorn platformdirs', 'notebook')}; until then plans in this kernel go nowhere"
        ) from None
    shared = public_url(port) if callable(public_url) else public_url
    db = db_path or Path(tempfile.mkdtemp(prefix="neurarch-service-")) / "shares.sqlite3"
    settings = Settings(host="127.0.0.1", port=port, db_path=db, public_url=shared or url, rate_limit=0)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="neurarch-plan-service",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise NeurarchError(f"the local plan service did not start on {url}")
        time.sleep(0.02)
    return PlanService(server, thread, sock, url, settings.resolved_public_url(), db)
