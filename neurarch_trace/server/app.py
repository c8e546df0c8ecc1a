"""``create_app(settings)``: the whole plan service, built from one settings object.

Everything (share store, rate limiter, routers, error handlers, headers) is built here and hung
on ``app.state``, so nothing is global: two apps with different settings can share a process.
The store is opened here, so a database that cannot be opened fails before the server listens.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict

import anyio
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from neurarch_trace._version import __version__
from neurarch_trace.server.errors import install_handlers
from neurarch_trace.server.ratelimit import RateLimiter
from neurarch_trace.server.routers import health, plan, shares
from neurarch_trace.server.schemas import PlanRequest
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.store import ShareStore

__all__ = ["PLAN_THREADS", "create_app"]

#: Plans computed at once per process (further requests wait their turn).
PLAN_THREADS = 2

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


def create_app(settings: Settings) -> FastAPI:
    """The FastAPI app for ``settings``. Raises ``StoreError`` when the share database cannot be
    opened."""
    store = ShareStore(settings.resolved_db_path())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            store.close()

    app = FastAPI(
        title="neurarch plan service",
        version=__version__,
        description=_DESCRIPTION,
        docs_url=None,  # the interactive docs load scripts from a CDN; the schema is at /openapi.json
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.limiter = RateLimiter(settings.rate_limit, settings.rate_window_s)
    # Planning is pure-Python CPU work: under the GIL more threads than this add only contention
    # (and starve the event loop that parses requests); the rest queue.
    app.state.plan_limiter = anyio.CapacityLimiter(PLAN_THREADS)
    install_handlers(app)
    app.include_router(plan.router)
    app.include_router(shares.router)
    app.include_router(health.router)
    app.add_middleware(_SecurityHeaders)

    def openapi() -> Dict[str, Any]:
        # The plan route reads its body itself (to bound size and nesting before parsing), so its
        # request schema is added to the components by hand.
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            request_schema = PlanRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request_schema.pop("$defs", {}))
            components["PlanRequest"] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
