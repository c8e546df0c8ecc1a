"""The plan service's settings: one validated, immutable object, built once and injected.

``create_app(Settings(...))`` takes it; route handlers read it through the ``get_settings``
dependency, which tests may override (``app.dependency_overrides``) as the FastAPI docs show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Settings", "default_db_path"]

#: Largest request body accepted, in bytes (16 MiB): a traced 7B-parameter LLM graph with every
#: measured field is about 0.3 MB, a 10,000-layer graph a few MB.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


def default_db_path() -> Path:
    """``shares.sqlite3`` in the user's data directory (``platformdirs``), e.g.
    ``~/.local/share/neurarch-trace/`` on Linux."""
    import platformdirs

    return Path(platformdirs.user_data_dir("neurarch-trace", appauthor=False)) / "shares.sqlite3"


class Settings(BaseModel):
    """Everything the service is configured with. Counts are per client IP and per window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="interface to listen on (loopback by default)")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one")
    db_path: Optional[Path] = Field(None, description="SQLite file for shares; default: user data dir")
    public_url: Optional[str] = Field(
        None, description="URL that share links start with; default http://HOST:PORT")
    rate_limit: int = Field(60, ge=0, description="anonymous calls per client IP per window; 0: no limit")
    rate_window_s: float = Field(3600.0, gt=0, description="length of the rate-limit window, seconds")
    api_keys: Tuple[str, ...] = Field((), description="bearer keys that lift the rate limit")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="largest request body, bytes")
    max_components: int = Field(100_000, ge=1, description="most components in one graph")
    max_connections: int = Field(400_000, ge=1, description="most connections in one graph")
    max_depth: int = Field(32, ge=4, le=200, description="deepest JSON nesting accepted")
    forwarded_allow_ips: str = Field(
        "127.0.0.1", description="proxies whose X-Forwarded-For is trusted for the client IP (uvicorn)")

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError("public_url must be an http(s) URL without query or fragment")
        return value.rstrip("/")

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: Tuple[str, ...]) -> Tuple[str, ...]:
        for key in value:
            if not key or key != key.strip() or any(ch.isspace() for ch in key):
                raise ValueError("an API key must be non-empty and contain no whitespace")
        return value

    def resolved_db_path(self) -> Path:
        """The SQLite file shares go to."""
        return self.db_path if self.db_path is not None else default_db_path()

    def resolved_public_url(self) -> str:
        """The prefix of share URLs: ``public_url``, else this server's own address."""
        if self.public_url:
            return self.public_url
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
