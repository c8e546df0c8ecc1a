"""``POST /api/v1/plan``: the card and plan for a graph, stored at a share URL when asked."""

from __future__ import annotations

import functools
import logging
from typing import Any, Dict

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from neurarch_trace.errors import GraphError
from neurarch_trace.planner import OptionError, make_plan
from neurarch_trace.server.body import check_graph_counts, parse_plan_request, read_json
from neurarch_trace.server.deps import check_caller, get_settings, get_store
from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.schemas import ErrorBody, PlanResponse
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.store import ShareStore, StoreError

__all__ = ["router"]

log = logging.getLogger("neurarch_trace.server")
router = APIRouter(tags=["plan"])

_ERRORS: Dict[int, Dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "malformed JSON or nesting too deep"),
        (401, "an Authorization header with a key this service does not know"),
        (413, "body or graph larger than this service accepts"),
        (415, "a body that is not JSON"),
        (422, "wrong field types, no 'model', or a 'model' that is not a graph"),
        (429, "anonymous rate limit reached (Retry-After says when to retry)"),
        (500, "unexpected fault"),
    )
}


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
    caller: str = Depends(check_caller),
    settings: Settings = Depends(get_settings),
    store: ShareStore = Depends(get_store),
) -> JSONResponse:
    body = parse_plan_request(await read_json(request, settings))
    check_graph_counts(body.model, "model", settings)
    if body.base is not None:
        check_graph_counts(body.base, "base", settings)
    source = body.source.model_dump() if body.source is not None else None
    try:
        answer = await anyio.to_thread.run_sync(
            functools.partial(make_plan, body.model, source=source, base=body.base, seq_len=body.seq_len,
                              attention=body.attention, finetune=body.finetune, context=body.context,
                              gpu=body.gpu, usd_per_hour=body.usd_per_hour),
            limiter=request.app.state.plan_limiter)
    except (GraphError, OptionError) as exc:  # a bad graph, or a bad option (an unknown gpu)
        raise ApiError(422, str(exc)) from None
    result: Dict[str, Any] = {"text": answer["text"], "plan": answer["plan"]}
    if body.share:
        try:
            share_id = await run_in_threadpool(store.put, body.model, answer["plan"], answer["text"])
        except StoreError as exc:
            log.error("share not stored: %s", exc)
            result["share_error"] = "the plan service could not store the share; nothing was stored"
        else:
            result["url"] = f"{settings.resolved_public_url()}/p/{share_id}"
    return JSONResponse(result)
