"""Test doubles for the plan client: a hand-made graph and a loopback HTTP server that misbehaves
on purpose (canned status and body, or an answer held back past any short timeout)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def small_graph(in_features: int = 4) -> dict:
    """input [4] -> linear(in_features -> 2) -> output [2]; in_features != 4 is a shape blocker."""
    return {
        "id": "g-small",
        "name": "Small",
        "description": "hand-made test graph",
        "components": [
            {"id": "n0", "name": "x", "type": "input", "params": {"shape": [4]}, "outputShape": [4],
             "position": {"x": 0, "y": 0}, "inputs": [], "outputs": ["n1"]},
            {"id": "n1", "name": "fc", "type": "linear",
             "params": {"inFeatures": in_features, "outFeatures": 2},
             "inputShape": [4], "outputShape": [2],
             "position": {"x": 0, "y": 100}, "inputs": ["n0"], "outputs": ["n2"]},
            {"id": "n2", "name": "output", "type": "output", "params": {}, "inputShape": [2],
             "position": {"x": 0, "y": 200}, "inputs": ["n1"], "outputs": []},
        ],
        "connections": [
            {"id": "e0", "from": "n0", "to": "n1", "fromPort": "bottom", "toPort": "top"},
            {"id": "e1", "from": "n1", "to": "n2", "fromPort": "bottom", "toPort": "top"},
        ],
    }


# ------------------------------------------------------------------ misbehaving loopback servers


class CannedServer:
    """A loopback HTTP server that answers every request with one canned answer and records the
    requests it got (method, path, headers, decoded JSON body).

    ``hold`` makes the handler wait until :meth:`close` before answering: a server slower than any
    short client timeout, without a fixed sleep.
    """

    def __init__(self) -> None:
        self.status = 200
        self.body: bytes = b"{}"
        self.headers: dict[str, str] = {"Content-Type": "application/json"}
        self.hold = False
        self.requests: list[dict[str, Any]] = []
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                server.requests.append(
                    {"method": "POST", "path": self.path, "headers": dict(self.headers),
                     "body": json.loads(raw) if raw else None}
                )
                if server.hold:
                    server._release.wait(60)  # released by close(); the bound only stops a leak
                    return
                self.send_response(server.status)
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self.host = f"127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def answer(self, status: int, body: Any, content_type: str = "application/json",
               **headers: str) -> CannedServer:
        """Set the canned answer; ``body`` is bytes, str, or anything JSON-serialisable."""
        self.status = status
        if isinstance(body, bytes):
            self.body = body
        elif isinstance(body, str):
            self.body = body.encode("utf-8")
        else:
            self.body = json.dumps(body).encode("utf-8")
        self.headers = {"Content-Type": content_type, **{k.replace("_", "-"): v for k, v in headers.items()}}
        return self

    def close(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


CARD = "+----+\n| ok |\n+----+\n"
