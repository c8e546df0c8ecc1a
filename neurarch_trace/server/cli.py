"""``neurarch-trace serve``: run the reference plan service with uvicorn.

    neurarch-trace serve [--host 127.0.0.1] [--port 8000] [--db PATH|URL] [--public-url URL]
                         [--rate-limit N] [--api-keys KEY ...] [--api-keys-file PATH]
                         [--forwarded-allow-ips IPS] [--share-ttl DURATION] [--share-quota-mb N]
                         [--plan-budget-s S] [--workers N] [--max-connections N] ...

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
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Optional

from neurarch_trace.text import install_hint

if TYPE_CHECKING:  # pragma: no cover - imported in main, after the command line is read
    from neurarch_trace.server.settings import Settings

__all__ = ["build_parser", "serve_main"]

KEYS_ENV = "NEURARCH_SERVER_API_KEYS"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr and exit code 1, as every other
    ``neurarch-trace`` command has it (``console.Parser``, which the service does not import)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(1, f"neurarch-trace: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser(prog: str = "neurarch-trace serve") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Run the reference plan service (POST /api/v1/plan, share pages at /p/<id>).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0 picks a free one)")
    parser.add_argument("--db", default=None, metavar="PATH|URL",
                        help="where shares, rate limits and quotas live: a SQLite file (default: shares.sqlite3 "
                             "in the user data directory) or postgresql://USER@HOST/DB, shared by replicas")
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
    parser.add_argument("--forwarded-allow-ips", default=None, metavar="IPS",
                        help="comma-separated proxy addresses or networks whose X-Forwarded-For names the "
                             "client (default: none; the connection's peer is the client)")
    parser.add_argument("--share-ttl", default=None, metavar="DURATION",
                        help="delete shares this long after they are made: 3600, 12h, 30d (default: keep)")
    parser.add_argument("--share-quota-mb", type=float, default=None, metavar="N",
                        help="compressed MiB of shares one client may store per day (default: 256; 0: no quota)")
    parser.add_argument("--plan-budget-s", type=float, default=None, metavar="S",
                        help="CPU seconds one plan may use (default: 5); over it the answer is 413")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="worker processes for small plans (default: CPU count, at most 4)")
    parser.add_argument("--heavy-workers", type=int, default=None, metavar="N",
                        help="worker processes for large plans, at lower priority (default: 1)")
    parser.add_argument("--worker-memory-mb", type=int, default=None, metavar="N",
                        help="address space of one worker process in MiB (default: 2048; 0: no cap)")
    parser.add_argument("--max-connections", type=int, default=None, metavar="N",
                        help="open connections at most (default: 1000); more are answered 503")
    parser.add_argument("--header-timeout", type=float, default=None, metavar="S",
                        help="seconds to receive request headers (default: 10)")
    parser.add_argument("--body-timeout", type=float, default=None, metavar="S",
                        help="seconds to receive a whole request body (default: 60)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level (default: info)")
    return parser


def _fail(message: str) -> int:
    print(f"neurarch-trace: {' '.join(message.split())}", file=sys.stderr)
    return 1


def _keys(args: argparse.Namespace) -> list[str]:
    keys = list(args.api_keys)
    keys += os.environ.get(KEYS_ENV, "").replace(",", " ").split()
    if args.api_keys_file is not None:
        text = args.api_keys_file.read_text(encoding="utf-8")
        keys += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return list(dict.fromkeys(keys))


_OPTIONAL = {"max_body_bytes": "max_body_bytes", "plan_budget_s": "plan_budget_s", "workers": "workers",
             "heavy_workers": "heavy_workers", "max_connections": "max_connections",
             "worker_memory_mb": "worker_memory_mb",
             "header_timeout": "header_timeout_s", "body_timeout": "body_timeout_s"}


_FLAGS = {"database_url": "--db", "share_ttl_s": "--share-ttl", "share_quota_bytes": "--share-quota-mb",
          "header_timeout_s": "--header-timeout", "body_timeout_s": "--body-timeout"}


def _options(args: argparse.Namespace, keys: list[str]) -> dict[str, Any]:
    """Settings fields from the command line (``ValueError`` for a bad duration)."""
    from neurarch_trace.server.settings import parse_duration

    options: dict[str, Any] = {"host": args.host, "port": args.port, "database_url": args.db,
                               "public_url": args.public_url, "rate_limit": args.rate_limit,
                               "api_keys": tuple(keys), "forwarded_allow_ips": args.forwarded_allow_ips}
    for arg, field in _OPTIONAL.items():
        if getattr(args, arg) is not None:
            options[field] = getattr(args, arg)
    if args.share_quota_mb is not None:
        options["share_quota_bytes"] = int(args.share_quota_mb * 2**20)
    if args.share_ttl is not None:
        try:
            options["share_ttl_s"] = parse_duration(args.share_ttl)
        except ValueError:
            raise ValueError(f"--share-ttl: {args.share_ttl!r} is not a duration (e.g. 3600, 12h, 30d)") from None
    return options


def _validation_message(error: Mapping[str, Any]) -> str:
    """pydantic's first complaint about the settings in the command line's words: the flag, what
    it must be, and what it got (``--port: must be less than or equal to 65535, not 70000``)."""
    field = str(error["loc"][0]) if error.get("loc") else ""
    where = _FLAGS.get(field, "--" + field.replace("_", "-")) if field else "an option"
    reason = str(error.get("msg", "is not valid"))
    if reason.startswith("Value error, "):  # a validator's own sentence
        return f"{where}: {reason[len('Value error, '):]}"
    if reason.startswith("Input should be "):
        reason = "must be " + reason[len("Input should be "):]
    given = error.get("input")
    return f"{where}: {reason}, not {given!r}" if isinstance(given, (int, float, str)) else f"{where}: {reason}"


def serve_main(argv: Sequence[str]) -> int:
    """Run ``neurarch-trace serve`` with ``argv`` (the words after ``serve``); the exit status."""
    args = build_parser().parse_args(list(argv))
    try:
        from pydantic import ValidationError

        from neurarch_trace.server.app import create_app
        from neurarch_trace.server.settings import Settings
        from neurarch_trace.server.store import StoreError
        from neurarch_trace.server.transport import bind_socket, build_server
    except ImportError as exc:
        return _fail(f"the plan service needs the server extra ({exc.name} is missing): "
                     f"{install_hint('fastapi uvicorn platformdirs', 'server')}")
    try:
        keys = _keys(args)
    except OSError as exc:
        return _fail(f"cannot read --api-keys-file {args.api_keys_file}: {exc.strerror or exc}")
    if args.db is not None and not args.db.strip():
        return _fail("--db needs a SQLite file path or a postgresql:// URL (leave it out for the default file)")
    try:
        settings = Settings(**_options(args, keys))
    except ValueError as exc:
        if not isinstance(exc, ValidationError):
            return _fail(str(exc))
        return _fail(_validation_message(exc.errors()[0]))

    try:
        sock = bind_socket(settings.host, settings.port)
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

    print(announcement(settings, bound_port, app.state.store.db.where), file=sys.stderr, flush=True)
    server = build_server(app, settings, log_level=args.log_level)
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


def announcement(settings: Settings, port: int, where: str) -> str:
    """The line ``serve`` prints once it listens: its address, where shares are stored and how
    share links start; listening on every interface without ``--public-url``, a note that the links
    name this machine's loopback address, which other machines cannot open."""
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    hint = ""
    if settings.public_url is None and settings.host in ("0.0.0.0", "", "::"):
        hint = "; set --public-url to the address others reach this service at"
    return (f"neurarch plan service on http://{shown_host}:{port} "
            f"(shares in {where}, links start {settings.resolved_public_url()}/p/){hint}")


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
