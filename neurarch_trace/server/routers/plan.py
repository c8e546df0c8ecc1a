"""``POST /api/v1/plan``: the card and plan for a graph, stored at a share URL when asked.

The event loop only checks the caller, reads the body within its limit and hands the bytes to a
worker process (:mod:`neurarch_trace.server.pool`), which parses, plans and serialises under a
CPU budget; the share, when asked, is stored from a thread. So a large plan never holds up a
health check or a small plan.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from neurarch_trace.server.body import read_body
from neurarch_trace.server.deps import Caller, check_caller, get_pool, get_settings, get_store
from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.pool import Busy, PlanPool
from neurarch_trace.server.schemas import ErrorBody, PlanResponse
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.store import QuotaExceeded, ShareStore, StoreError

__all__ = ["router"]

log = logging.getLogger("neurarch_trace.server")
router = APIRouter(tags=["plan"])

_ERRORS: dict[int, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "malformed JSON, a non-finite number, or nesting too deep"),
        (401, "an Authorization header with a key this service does not know"),
        (408, "the request was not received in time"),
        (413, "body larger than this service accepts, or a plan over its CPU budget"),
        (415, "a body that is not declared JSON, or a compressed body"),
        (422, "wrong field types, no 'model', or a 'model' that is not a graph"),
        (429, "anonymous rate limit reached (Retry-After says when to retry)"),
        (500, "unexpected fault"),
        (503, "every worker busy or the database unreachable (Retry-After says when to retry)"),
    )
}


async def _store_share(store: ShareStore, result: Any, caller: Caller, settings: Settings) -> dict[str, str]:
    share_id, created, doc_gz = result.share
    try:
        await anyio.to_thread.run_sync(store.put, share_id, created, doc_gz, caller.bucket)
    except QuotaExceeded as exc:
        return {"share_error": str(exc)}
    except StoreError as exc:
        log.error("share not stored: %s", exc)
        return {"share_error": "the plan service could not store the share; nothing was stored"}
    return {"url": f"{settings.resolved_public_url()}/p/{share_id}"}


@router.post(
    "/api/v1/plan",
    summary="Plan a graph: will it run, where, and at what cost",
    response_model=PlanResponse,
    responses=_ERRORS,  # type: ignore[arg-type]
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PlanRequest"}}},
        }
    },
)
async def plan(
    request: Request,
    caller: Annotated[Caller, Depends(check_caller)],
    settings: Annotated[Settings, Depends(get_settings)],
    store: Annotated[ShareStore, Depends(get_store)],
    pool: Annotated[PlanPool, Depends(get_pool)],
) -> Response:
    raw = await read_body(request, settings)
    try:
        result = await pool.plan(raw)
    except Busy as exc:
        raise ApiError(503, str(exc), {"Retry-After": str(exc.retry_after)}) from None
    if result.status != 200:
        raise ApiError(result.status, result.sentence)
    body = result.body
    if result.share is not None:
        extra = await _store_share(store, result, caller, settings)
        body = body[:-1] + b"," + json.dumps(extra, separators=(",", ":"))[1:].encode("utf-8")
    return Response(body, media_type="application/json")
