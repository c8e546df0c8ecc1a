"""Dependencies the routes declare: the settings, the share store, and the caller check.

Each reads what :func:`~neurarch_trace.server.app.create_app` put on ``app.state``, so one process
can run several apps with different settings (as the tests do), and a test can replace any of
them through ``app.dependency_overrides``.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, Request

from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.ratelimit import RateLimiter
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.store import ShareStore

__all__ = ["check_caller", "get_limiter", "get_settings", "get_store"]


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> ShareStore:
    return request.app.state.store


def get_limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter


def _valid_key(token: str, keys: tuple) -> bool:
    # compare against every key, in constant time per key, so timing says nothing about which
    found = False
    for key in keys:
        found |= hmac.compare_digest(token.encode("utf-8", "surrogatepass"), key.encode("utf-8", "surrogatepass"))
    return found


def _window(seconds: float) -> str:
    if seconds % 3600 == 0:
        hours = int(seconds // 3600)
        return "hour" if hours == 1 else f"{hours} hours"
    if seconds % 60 == 0:
        minutes = int(seconds // 60)
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds:g} seconds"


def check_caller(
    request: Request,
    settings: Settings = Depends(get_settings),
    limiter: RateLimiter = Depends(get_limiter),
) -> str:
    """``"key"`` for a caller with a valid bearer key (no limit), else ``"anonymous"`` after
    counting the call against the client IP's limit. A present but invalid key is a 401; an
    anonymous caller over the limit a 429 with ``Retry-After``. A service configured with no keys
    issues none, so it ignores an ``Authorization`` header (a key exported for another deployment
    must not lock a user out of a local one) and treats every caller as anonymous."""
    header = request.headers.get("authorization") if settings.api_keys else None
    if header is not None:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or not _valid_key(token, settings.api_keys):
            raise ApiError(401, "the API key is not valid for this plan service",
                           {"WWW-Authenticate": 'Bearer realm="neurarch"'})
        return "key"
    client = request.client.host if request.client else "unknown"
    wait = limiter.hit(client)
    if wait is not None:
        raise ApiError(
            429,
            f"rate limit reached: anonymous callers get {settings.rate_limit} "
            f"plan{'s' if settings.rate_limit != 1 else ''} per {_window(settings.rate_window_s)} per IP"
            + ("; set NEURARCH_API_KEY to a key of this service" if settings.api_keys else ""),
            {"Retry-After": str(wait)},
        )
    return "anonymous"
