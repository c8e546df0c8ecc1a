"""``create_app(settings)``: the whole plan service, built from one settings object.

Everything (database, share store, rate limiter, worker pool, routers, error handlers, headers)
is built here and hung on ``app.state``, so nothing is global: two apps with different settings
can share a process. The database is opened here, so one that cannot be opened fails before the
server listens; the worker processes start with the first plan and stop with the app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from neurarch_trace._version import __version__
from neurarch_trace.server.db import open_database
from neurarch_trace.server.errors import install_handlers
from neurarch_trace.server.pool import PlanPool
from neurarch_trace.server.ratelimit import RateLimiter
from neurarch_trace.server.routers import health, plan, shares
from neurarch_trace.server.schemas import ErrorBody, Graph, PlanRequest
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.store import ShareStore

__all__ = ["create_app"]

_REF = "#/components/schemas/{model}"

_DESCRIPTION = (
    "The reference Neurarch plan service: POST a .neurarch.json graph to /api/v1/plan and get the "
    "card (will it run, where, and at what cost) and the same facts as JSON. Errors answer "
    '{"error": "<one sentence>"}.'
)


class _SecurityHeaders:
    """Pure ASGI middleware: ``nosniff`` on every answer, ``no-store`` unless a route set caching."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers.append((b"x-content-type-options", b"nosniff"))
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The schema, with what the routes cannot declare: the plan request (the route reads its body
    itself), the graph's structure under ``model`` and ``base``, and every error as JSON."""
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (PlanRequest, Graph, ErrorBody):
        model_schema = model.model_json_schema(ref_template=_REF, by_alias=True)
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
    properties = components["PlanRequest"]["properties"]
    properties["model"] = {"$ref": _REF.format(model="Graph"), "description": "the .neurarch.json graph"}
    properties["base"] = {"anyOf": [{"$ref": _REF.format(model="Graph")}, {"type": "null"}],
                          "description": "the graph being changed from: adds a diff"}
    error = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                if status[:1] in ("4", "5"):
                    response["content"] = error
    return schema


def create_app(settings: Settings) -> FastAPI:
    """The FastAPI app for ``settings``. Raises ``StoreError`` when the share database cannot be
    opened."""
    # the default file's folder (the user data dir) is made; a --db path's must exist
    db = open_database(settings.resolved_database_url(), create_folder=settings.database_url is None)
    try:
        store = ShareStore(db, ttl_s=settings.share_ttl_s, quota_bytes=settings.share_quota_bytes,
                           quota_window_s=settings.share_quota_window_s)
    except Exception:
        db.close()
        raise
    pool = PlanPool(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            pool.close()
            store.close()

    app = FastAPI(
        title="neurarch plan service",
        version=__version__,
        description=_DESCRIPTION,
        docs_url=None,  # the interactive docs load scripts from a CDN; the schema is at /openapi.json
        redoc_url=None,
        redirect_slashes=False,  # Starlette's redirect builds Location from the Host header
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.pool = pool
    app.state.limiter = RateLimiter(db, settings.rate_limit, settings.rate_window_s, settings.rate_buckets_max)
    install_handlers(app)
    app.include_router(plan.router)
    app.include_router(shares.router)
    app.include_router(health.router)
    app.add_middleware(_SecurityHeaders)
    if settings.forwarded_allow_ips:
        # Only named proxies are believed; from anyone else X-Forwarded-For is ignored.
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.forwarded_allow_ips)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
