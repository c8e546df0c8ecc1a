"""``neurarch-trace serve``: run the reference plan service with uvicorn.

    neurarch-trace serve [--host 127.0.0.1] [--port 8000] [--db PATH] [--public-url URL]
                         [--rate-limit N] [--api-keys KEY ...] [--api-keys-file PATH]

Loopback by default. The socket is bound and the database opened before anything is served, so a
port in use or an unwritable database is one line on stderr (``neurarch-trace: ...``) and exit
status 1. Keys can also come from ``NEURARCH_SERVER_API_KEYS`` (comma- or space-separated) or a
file with one key per line, which keeps them out of ``ps``.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["build_parser", "serve_main"]

KEYS_ENV = "NEURARCH_SERVER_API_KEYS"


def build_parser(prog: str = "neurarch-trace serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the reference plan service (POST /api/v1/plan, share pages at /p/<id>).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0 picks a free one)")
    parser.add_argument("--db", type=Path, default=None, metavar="PATH",
                        help="SQLite file for shared plans (default: shares.sqlite3 in the user data directory)")
    parser.add_argument("--public-url", default=None, metavar="URL",
                        help="start of share links, e.g. https://plans.example.com (default: http://HOST:PORT)")
    parser.add_argument("--rate-limit", type=int, default=60, metavar="N",
                        help="anonymous plan calls per client IP per hour (default: 60; 0: no limit)")
    parser.add_argument("--api-keys", nargs="+", default=[], metavar="KEY",
                        help=f"bearer keys that lift the rate limit (also ${KEYS_ENV})")
    parser.add_argument("--api-keys-file", type=Path, default=None, metavar="PATH",
                        help="file with one bearer key per line")
    parser.add_argument("--max-body-bytes", type=int, default=None, metavar="N",
                        help="largest request body in bytes (default: 16 MiB)")
    parser.add_argument("--forwarded-allow-ips", default="127.0.0.1", metavar="IPS",
                        help="proxies trusted for X-Forwarded-For (default: 127.0.0.1)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level (default: info)")
    return parser


def _fail(message: str) -> int:
    print(f"neurarch-trace: {' '.join(message.split())}", file=sys.stderr)
    return 1


def _keys(args: argparse.Namespace) -> List[str]:
    keys = list(args.api_keys)
    keys += os.environ.get(KEYS_ENV, "").replace(",", " ").split()
    if args.api_keys_file is not None:
        text = args.api_keys_file.read_text(encoding="utf-8")
        keys += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return list(dict.fromkeys(keys))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def serve_main(argv: Sequence[str]) -> int:
    """Run ``neurarch-trace serve`` with ``argv`` (the words after ``serve``); the exit status."""
    args = build_parser().parse_args(list(argv))
    try:
        import uvicorn
        from pydantic import ValidationError

        from neurarch_trace.server.app import create_app
        from neurarch_trace.server.settings import Settings
        from neurarch_trace.server.store import StoreError
    except ImportError as exc:
        return _fail(f"the plan service needs the server extra ({exc.name} is missing): "
                     "pip install 'neurarch-trace[server]'")
    try:
        keys = _keys(args)
    except OSError as exc:
        return _fail(f"cannot read --api-keys-file {args.api_keys_file}: {exc.strerror or exc}")
    options = {"host": args.host, "port": args.port, "db_path": args.db, "public_url": args.public_url,
               "rate_limit": args.rate_limit, "api_keys": tuple(keys),
               "forwarded_allow_ips": args.forwarded_allow_ips}
    if args.max_body_bytes is not None:
        options["max_body_bytes"] = args.max_body_bytes
    try:
        settings = Settings(**options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "--" + str(first["loc"][0]).replace("_", "-") if first.get("loc") else "an option"
        return _fail(f"{where}: {first['msg']}")

    try:
        sock = _bind(settings.host, settings.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return _fail(f"cannot listen on {settings.host}:{settings.port}: the port is already in use "
                         "(choose another with --port)")
        return _fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}")
    bound_port = sock.getsockname()[1]
    if bound_port != settings.port:
        settings = settings.model_copy(update={"port": bound_port})
    try:
        app = create_app(settings)
    except StoreError as exc:
        sock.close()
        return _fail(str(exc))

    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(f"neurarch plan service on http://{shown_host}:{bound_port} "
          f"(shares in {settings.resolved_db_path()}, links start {settings.resolved_public_url()}/p/)",
          file=sys.stderr)
    config = uvicorn.Config(app, log_level=args.log_level, proxy_headers=True,
                            forwarded_allow_ips=settings.forwarded_allow_ips, server_header=False)
    server = uvicorn.Server(config)
    _stop_on_sigterm()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # Ctrl-C or SIGTERM, after uvicorn's graceful shutdown: a normal stop
    finally:
        sock.close()
    return 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop_on_sigterm() -> None:
    """uvicorn shuts down gracefully on SIGTERM, then re-raises the signal under the handler it
    found; with this one that ends as a normal stop (exit 0) instead of death by signal."""
    try:
        signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:
        pass  # not the main thread: leave signals alone


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m neurarch_trace.server [options]``."""
    return serve_main(sys.argv[1:] if argv is None else argv)
