"""``GET /p/<id>`` (HTML page), ``GET /p/<id>.json`` (stored graph and plan), and the page's one
script, the notebook widget's front-end bundle (``GET /p/_static/neurarch-widget.js``).

An id that does not exist, or cannot exist, answers the same 404 ``{"error": "not found"}``:
nothing says whether it was ever issued.
"""

from __future__ import annotations

import json
import secrets

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from neurarch_trace.server.deps import get_store
from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.page import BUNDLE_ROUTE, bundle, content_security_policy, render_share_page
from neurarch_trace.server.schemas import ErrorBody
from neurarch_trace.server.store import Share, ShareStore

__all__ = ["router"]

router = APIRouter(tags=["shares"])
_NOT_FOUND = {404: {"model": ErrorBody, "description": "no such share"}}
#: Headers of a share: not indexed, not cached by shared caches, and no Referer leaking the link.
_SHARE_HEADERS = {"X-Robots-Tag": "noindex, nofollow", "Cache-Control": "private, max-age=300",
                  "Referrer-Policy": "no-referrer"}


async def _load(store: ShareStore, share_id: str) -> Share:
    share = await run_in_threadpool(store.get, share_id)
    if share is None:
        raise ApiError(404, "not found")
    return share


@router.get("/p/" + BUNDLE_ROUTE, include_in_schema=False)
async def widget_bundle() -> Response:
    """The front end the share page (and the notebook widget) runs; versioned by ``?v=<digest>``."""
    try:
        data, _ = bundle()
    except OSError:
        raise ApiError(404, "not found") from None
    return Response(data, media_type="text/javascript; charset=utf-8",
                    headers={"Cache-Control": "public, max-age=86400"})


# Registered before /p/{share_id}, which would otherwise also match "<id>.json".
@router.get("/p/{share_id}.json", summary="A shared graph and its plan", responses=_NOT_FOUND)
async def share_json(share_id: str, store: ShareStore = Depends(get_store)) -> Response:
    share = await _load(store, share_id)
    body = (
        '{"id":' + json.dumps(share.id) + ',"created":' + json.dumps(share.created)
        + ',"text":' + json.dumps(share.text, ensure_ascii=False)
        + ',"graph":' + share.graph_json + ',"plan":' + share.plan_json + "}"
    )
    return Response(body.encode("utf-8"), media_type="application/json", headers=_SHARE_HEADERS)


@router.get("/p/{share_id}", summary="A shared plan as a web page", response_class=HTMLResponse,
            responses=_NOT_FOUND)
async def share_page(share_id: str, store: ShareStore = Depends(get_store)) -> HTMLResponse:
    share = await _load(store, share_id)
    nonce = secrets.token_urlsafe(18)
    page = await run_in_threadpool(
        lambda: render_share_page(share.id, share.created, share.text, share.plan, nonce=nonce))
    return HTMLResponse(page, headers={**_SHARE_HEADERS, "Content-Security-Policy": content_security_policy(nonce)})
