"""Dependencies the routes declare: the settings, the share store, and the caller check.

Each reads what :func:`~neurarch_trace.server.app.create_app` put on ``app.state``, so one process
can run several apps with different settings (as the tests do), and a test can replace any of
them through ``app.dependency_overrides``.

A caller is counted by its *bucket*: ``key:<digest>`` for a valid bearer key, else the client
address, which is the socket's peer unless ``forwarded_allow_ips`` names that peer as a proxy
(then uvicorn's ``ProxyHeadersMiddleware`` has put the forwarded address there). An IPv6 client
is bucketed by its /64 network, the block one subscriber gets, so rotating addresses inside it
earns no new bucket.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Annotated

import anyio.to_thread
from fastapi import Depends, Request

from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.pool import PlanPool
from neurarch_trace.server.ratelimit import RateLimiter
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.store import ShareStore, StoreError

__all__ = ["Caller", "check_caller", "client_bucket", "get_limiter", "get_pool", "get_settings", "get_store"]


@dataclass(frozen=True)
class Caller:
    """``kind`` is ``"key"`` or ``"anonymous"``; ``bucket`` what its rate limit and quota count."""

    kind: str
    bucket: str


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> ShareStore:
    return request.app.state.store


def get_limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter


def get_pool(request: Request) -> PlanPool:
    return request.app.state.pool


def client_bucket(host: str) -> str:
    """``ip:203.0.113.7``, ``ip:2001:db8:1:2::/64``, or ``peer:<text>`` for a non-IP peer."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "peer:" + host[:100]
    if address.version == 6 and address.ipv4_mapped is None:
        return "ip:" + str(ipaddress.ip_network(f"{address}/64", strict=False))
    return "ip:" + str(getattr(address, "ipv4_mapped", None) or address)


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


async def check_caller(
    request: Request,
    settings: Annotated[Settings, Depends(get_settings)],
    limiter: Annotated[RateLimiter, Depends(get_limiter)],
) -> Caller:
    """A ``"key"`` caller for a valid bearer key (no limit), else ``"anonymous"`` after counting
    the call against the client's limit (in a thread: the count lives in the database). A present
    but invalid key is a 401; an anonymous caller over the limit a 429 with ``Retry-After``, and a
    database that cannot count a 503 (the limit fails closed). A service configured with no keys
    issues none, so it ignores an ``Authorization`` header (a key exported for another deployment
    must not lock a user out of a local one) and treats every caller as anonymous."""
    header = request.headers.get("authorization") if settings.api_keys else None
    if header is not None:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or not _valid_key(token, settings.api_keys):
            raise ApiError(401, "the API key is not valid for this plan service",
                           {"WWW-Authenticate": 'Bearer realm="neurarch"'})
        return Caller("key", "key:" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:24])
    bucket = client_bucket(request.client.host if request.client else "unknown")
    try:
        wait = await anyio.to_thread.run_sync(limiter.hit, bucket)
    except StoreError as exc:
        raise ApiError(503, "the plan service cannot reach its database; retry shortly",
                       {"Retry-After": "5"}) from exc
    if wait is not None:
        raise ApiError(
            429,
            f"rate limit reached: anonymous callers get {settings.rate_limit} "
            f"plan{'s' if settings.rate_limit != 1 else ''} per {_window(settings.rate_window_s)} per IP"
            + ("; set NEURARCH_API_KEY to a key of this service" if settings.api_keys else ""),
            {"Retry-After": str(wait)},
        )
    return Caller("anonymous", bucket)
