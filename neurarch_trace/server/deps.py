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


def check_caller(
    request: Request,
    settings: Settings = Depends(get_settings),
    limiter: RateLimiter = Depends(get_limiter),
) -> str:
    """``"key"`` for a caller with a valid bearer key (no limit), else ``"anonymous"`` after
    counting the call against the client IP's limit. A present but invalid key is a 401; an
    anonymous caller over the limit a 429 with ``Retry-After``."""
    header = request.headers.get("authorization")
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
            f"rate limit reached: anonymous callers get {settings.rate_limit} plans per "
            f"{settings.rate_window_s / 3600:g} h per IP; set NEURARCH_API_KEY to a key of this service",
            {"Retry-After": str(wait)},
        )
    return "anonymous"
