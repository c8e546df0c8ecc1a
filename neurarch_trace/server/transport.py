"""The HTTP transport: the listening socket and uvicorn's h11 protocol with read timeouts.

:func:`bind_socket` binds with ``IPPROTO_TCP`` as the protocol number: asyncio sets
``TCP_NODELAY`` on accepted connections only when the listening socket says it is TCP, and a
socket opened with ``proto=0`` made every kept-alive answer wait for the client's delayed ACK
(Nagle's algorithm: about 40 ms a request on Linux loopback).

:class:`TimedH11Protocol` is uvicorn's h11 protocol with what it lacks for a public service:

* a header timeout (``header_timeout_s`` from the connection's start, or the end of the previous
  answer, to the end of the request headers), a read timeout (``read_timeout_s`` of silence
  while a body is due) and a body timeout (``body_timeout_s`` for the whole body): each answers
  408 and closes, so slow clients cannot hold connections (uvicorn's own keep-alive timeout ends
  only idle connections, and any byte resets it);
* a connection cap (``max_connections``): one more is answered 503 and closed at once;
* its own HTTP-layer errors (malformed requests, the cap, the timeouts) as ``{"error": ...}``
  JSON like every other answer, not uvicorn's plain text.

:func:`build_server` makes the ``uvicorn.Server`` with all of it, for ``neurarch-trace serve`` and
the tests alike.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from neurarch_trace.server.settings import Settings

__all__ = ["TimedH11Protocol", "bind_socket", "build_server", "raw_error"]

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


def raw_error(status: int, sentence: str) -> bytes:
    """A whole HTTP/1.1 error answer with a ``{"error": ...}`` body and ``Connection: close``."""
    body = json.dumps({"error": sentence}).encode("utf-8")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"x-content-type-options: nosniff\r\ncache-control: no-store\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))) + body


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host:port`` (non-blocking; ``SO_REUSEADDR``). Raises ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header, read and body timeouts, a connection cap and JSON
    errors. The limits are class attributes; :func:`protocol_for` makes a subclass per service."""

    header_timeout_s = 10.0
    read_timeout_s = 15.0
    body_timeout_s = 60.0
    max_connections = 1000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: Any = None
        self._deadline: Optional[asyncio.TimerHandle] = None
        self._idle: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.logger.warning("connection refused: %d open connections", len(self.connections) - 1)
            transport.write(raw_error(503, "the plan service has too many open connections; retry shortly"))
            transport.close()
            return
        self._update_timers()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._update_timers(activity=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update_timers()

    def send_400_response(self, msg: str) -> None:
        self._cancel()
        self.transport.write(raw_error(400, "the request is not valid HTTP/1.1"))
        self.transport.close()

    # -- timers ---------------------------------------------------------------------------------

    def _cancel(self) -> None:
        for handle in (self._deadline, self._idle):
            if handle is not None:
                handle.cancel()
        self._deadline = self._idle = None

    def _update_timers(self, activity: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            self._cancel()
            return
        phase = self.conn.their_state
        if phase is not self._phase:
            self._phase = phase
            self._cancel()
            if phase is h11.IDLE:
                self._deadline = self.loop.call_later(self.header_timeout_s, self._expire, "headers",
                                                      self.header_timeout_s)
            elif phase is h11.SEND_BODY:
                self._deadline = self.loop.call_later(self.body_timeout_s, self._expire, "body",
                                                      self.body_timeout_s)
                activity = True
        if phase is h11.SEND_BODY and activity:
            if self._idle is not None:
                self._idle.cancel()
            self._idle = self.loop.call_later(self.read_timeout_s, self._expire, "pause", self.read_timeout_s)

    def _expire(self, what: str, seconds: float) -> None:
        if self.transport.is_closing():
            return
        if what == "headers" and self.cycle is not None and not self.cycle.response_complete:
            return  # the app is still answering the previous request; its own budget bounds it
        sentence = {
            "headers": f"the request headers did not arrive within {seconds:g} seconds",
            "body": f"the request body did not arrive within {seconds:g} seconds",
            "pause": f"the request body stalled for {seconds:g} seconds",
        }[what]
        self.logger.info("closing a connection: %s", sentence)
        cycle = self.cycle
        answered = cycle is not None and cycle.response_started and self._phase is not h11.IDLE
        if not answered and not (what == "headers" and self.conn.their_state is h11.IDLE
                                 and not self._partial_request()):
            self.transport.write(raw_error(408, sentence))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() now reports a disconnect
            cycle.message_event.set()
        self._cancel()
        self.transport.close()

    def _partial_request(self) -> bool:
        """Whether some bytes of a next request arrived (a silent idle connection gets no 408)."""
        buffered = getattr(self.conn, "trailing_data", (b"", False))[0]
        return bool(buffered)


def protocol_for(settings: Settings) -> type:
    """A :class:`TimedH11Protocol` subclass with ``settings``' limits."""
    return type("ServiceH11Protocol", (TimedH11Protocol,), {
        "header_timeout_s": settings.header_timeout_s,
        "read_timeout_s": settings.read_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "max_connections": settings.max_connections,
    })


def build_server(app: Any, settings: Settings, log_level: str = "info") -> uvicorn.Server:
    """The ``uvicorn.Server`` for ``app`` with the transport limits of ``settings``. Forwarded
    headers are handled inside the app (only from ``forwarded_allow_ips``), never by uvicorn."""
    config = uvicorn.Config(
        app, http=protocol_for(settings), log_level=log_level, proxy_headers=False, server_header=False,
        timeout_keep_alive=int(max(1, settings.keep_alive_s)), timeout_graceful_shutdown=30, lifespan="on",
    )
    return uvicorn.Server(config)


def serve(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Run ``server`` on the already bound ``sockets`` until it is told to stop."""
    server.run(sockets=sockets)
