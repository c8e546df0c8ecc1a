"""The plan service's settings: one validated, immutable object, built once and injected.

``create_app(Settings(...))`` takes it; route handlers read it through the ``get_settings``
dependency, which tests may override (``app.dependency_overrides``) as the FastAPI docs show.
One field, ``database_url``, says where shares, rate-limit buckets and quotas live: a SQLite file
(the embedded default) or a PostgreSQL server that several replicas share.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Settings", "default_db_path", "parse_duration"]

#: Largest request body accepted, in bytes (16 MiB): a traced 7B-parameter LLM graph with every
#: measured field is about 0.3 MB, a 10,000-layer graph a few MB.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: CPU seconds one request may use in a worker (parse, validate, plan, serialise, compress): a
#: 10,000-layer graph needs about 0.4 s on the development machine, a 100,000-layer one about 6 s.
DEFAULT_PLAN_BUDGET_S = 5.0

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def default_db_path() -> Path:
    """``shares.sqlite3`` in the user's data directory (``platformdirs``), e.g.
    ``~/.local/share/neurarch-trace/`` on Linux."""
    import platformdirs

    return Path(platformdirs.user_data_dir("neurarch-trace", appauthor=False)) / "shares.sqlite3"


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90``, ``90s``, ``15m``, ``12h`` or ``30d``. Raises ``ValueError``."""
    text = text.strip().lower()
    scale = _UNITS.get(text[-1:], None)
    number = text[:-1] if scale is not None else text
    value = float(number) * (scale or 1)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a positive duration (e.g. 3600, 12h, 30d)")
    return value


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class Settings(BaseModel):
    """Everything the service is configured with. Rate-limit counts are per client and per window;
    a client is its IP address (an IPv6 client its /64 network), or its key when it sends one."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    host: str = Field("127.0.0.1", description="interface to listen on (loopback by default)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one")
    database_url: Optional[str] = Field(
        None, validation_alias=AliasChoices("database_url", "db_path", "db"),
        description="sqlite:///PATH, a plain SQLite file path, or postgresql://...; default: a SQLite "
                    "file in the user data dir")
    public_url: Optional[str] = Field(
        None, description="URL that share links start with; default http://HOST:PORT")
    rate_limit: int = Field(60, ge=0, description="anonymous plan calls per client per window; 0: no limit")
    rate_window_s: float = Field(3600.0, gt=0, description="length of the rate-limit window, seconds")
    rate_buckets_max: int = Field(100_000, ge=1, description="rate-limit buckets kept at most (oldest go first)")
    api_keys: tuple[str, ...] = Field((), description="bearer keys that lift the rate limit")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="largest request body, bytes")
    max_depth: int = Field(32, ge=4, le=200, description="deepest JSON nesting accepted")
    plan_budget_s: float = Field(DEFAULT_PLAN_BUDGET_S, gt=0, le=3600,
                                 description="CPU seconds one plan may use in a worker; over it: 413")
    workers: int = Field(default_factory=_default_workers, ge=1, le=64,
                         description="worker processes for small plans")
    heavy_workers: int = Field(1, ge=1, le=64, description="worker processes (at lower priority) for large plans")
    fast_lane_bytes: int = Field(4 * 1024 * 1024, ge=0,
                                 description="bodies up to this size (a 10,000-layer graph is ~3 MB) start in the "
                                             "fast lane")
    fast_lane_budget_s: float = Field(1.0, gt=0, description="CPU seconds a plan may take in the fast lane "
                                                              "before it moves to the large-plan lane")
    worker_memory_mb: int = Field(2048, ge=0, description="address space of one worker process, MiB "
                                                          "(a 100,000-layer plan peaks near 400 MiB); 0: no cap")
    queue_max: int = Field(64, ge=1, description="plans waiting per lane at most; more: 503")
    forwarded_allow_ips: Optional[str] = Field(
        None, description="comma-separated proxy IPs or networks whose X-Forwarded-For and "
                          "X-Forwarded-Proto are trusted; default: none (the socket peer is the client)")
    header_timeout_s: float = Field(10.0, gt=0, description="seconds to receive a request's headers")
    read_timeout_s: float = Field(15.0, gt=0, description="seconds a request body may pause between bytes")
    body_timeout_s: float = Field(60.0, gt=0, description="seconds to receive a whole request body")
    keep_alive_s: float = Field(5.0, gt=0, description="seconds an idle kept-alive connection stays open")
    max_connections: int = Field(1000, ge=1, description="open connections at most; more get a 503")
    share_quota_bytes: int = Field(256 * 1024 * 1024, ge=0,
                                   description="compressed share bytes one client may store per quota "
                                               "window; 0: no quota")
    share_quota_window_s: float = Field(86400.0, gt=0, description="length of the share-quota window, seconds")
    share_ttl_s: Optional[float] = Field(None, gt=0, description="seconds a share is kept; default: forever")

    @field_validator("database_url", mode="before")
    @classmethod
    def _normalise_db(cls, value: object) -> Optional[str]:
        if value is None:
            return None
        text = str(value)
        if text.startswith(("postgresql://", "postgres://", "sqlite:///")):
            return text
        if "://" in text:
            raise ValueError("the database must be a file path, sqlite:///PATH or postgresql://...")
        return "sqlite:///" + str(Path(text).expanduser().absolute())

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError("must be an http(s) URL without a query or fragment")
        return value.rstrip("/")

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _check_proxies(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        items = [item.strip() for item in value.split(",")]
        for item in items:
            if item == "*":
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (e.g. 10.0.0.1, 10.0.0.0/8, or * for "
                                 "any)") from None
        return ",".join(items)

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for key in value:
            if not key or key != key.strip() or any(ch.isspace() for ch in key):
                raise ValueError("an API key must be non-empty and contain no whitespace")
        return value

    def resolved_database_url(self) -> str:
        """The database URL, the default SQLite file when none was given."""
        return self.database_url or "sqlite:///" + str(default_db_path())

    def resolved_db_path(self) -> Optional[Path]:
        """The SQLite file shares go to, or ``None`` on PostgreSQL."""
        url = self.resolved_database_url()
        return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None

    def resolved_public_url(self) -> str:
        """The prefix of share URLs: ``public_url``, else this server's own address."""
        if self.public_url:
            return self.public_url
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
