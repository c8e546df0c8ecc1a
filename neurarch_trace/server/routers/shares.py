"""``GET``/``HEAD /p/<id>`` (HTML page), ``GET``/``HEAD /p/<id>.json`` (stored graph and plan), and
the page's one script, the notebook widget's front-end bundle (``GET /p/_static/neurarch-widget.js``).

An id that does not exist, cannot exist or has expired answers the same 404
``{"error": "not found"}``: nothing says whether it was ever issued. ``/p/<id>/`` redirects to the
page with a relative ``Location`` (``../<id>``), never one built from the request's ``Host``.
The JSON is the stored document itself: sent as stored (gzip) to a client that accepts gzip,
decompressed in a thread for one that does not. The page is rendered in a worker process.
"""

from __future__ import annotations

import secrets
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from neurarch_trace.server.deps import get_pool, get_store
from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.page import BUNDLE_ROUTE, bundle, content_security_policy
from neurarch_trace.server.pool import Busy, PlanPool
from neurarch_trace.server.schemas import ErrorBody
from neurarch_trace.server.store import ID_PATTERN, Share, ShareStore, StoreError

__all__ = ["router"]

router = APIRouter(tags=["shares"])
_NOT_FOUND = {404: {"model": ErrorBody, "description": "no such share"}}
#: Headers of a share: not indexed, not cached by shared caches, and no Referer leaking the link.
_SHARE_HEADERS = {"X-Robots-Tag": "noindex, nofollow", "Cache-Control": "private, max-age=300",
                  "Referrer-Policy": "no-referrer"}


async def _load(store: ShareStore, share_id: str) -> Share:
    try:
        share = await anyio.to_thread.run_sync(store.get, share_id)
    except StoreError as exc:
        raise ApiError(503, "the plan service cannot reach its database; retry shortly",
                       {"Retry-After": "5"}) from exc
    if share is None:
        raise ApiError(404, "not found")
    return share


def _accepts_gzip(request: Request) -> bool:
    for part in request.headers.get("accept-encoding", "").split(","):
        token, _, params = part.strip().partition(";")
        if token.strip().lower() in ("gzip", "x-gzip"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


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
@router.get("/p/{share_id}.json", summary="A shared graph and its plan", responses=_NOT_FOUND,
            operation_id="share_json")
@router.head("/p/{share_id}.json", summary="Whether a share exists (JSON)", responses=_NOT_FOUND,
             operation_id="share_json_head")
async def share_json(share_id: str, request: Request,
                     store: Annotated[ShareStore, Depends(get_store)]) -> Response:
    share = await _load(store, share_id)
    headers: dict[str, str] = {**_SHARE_HEADERS, "Vary": "Accept-Encoding"}
    if _accepts_gzip(request):
        return Response(share.doc_gz, media_type="application/json", headers={**headers, "Content-Encoding": "gzip"})
    return Response(await anyio.to_thread.run_sync(share.document), media_type="application/json", headers=headers)


@router.get("/p/{share_id}", summary="A shared plan as a web page", response_class=HTMLResponse,
            responses=_NOT_FOUND, operation_id="share_page")
@router.head("/p/{share_id}", summary="Whether a share exists (page)", response_class=HTMLResponse,
             responses=_NOT_FOUND, operation_id="share_page_head")
async def share_page(share_id: str, request: Request, store: Annotated[ShareStore, Depends(get_store)],
                     pool: Annotated[PlanPool, Depends(get_pool)]) -> Response:
    share = await _load(store, share_id)
    nonce = secrets.token_urlsafe(18)  # the bundle's script tag carries it; nothing else may run
    headers = {**_SHARE_HEADERS, "Content-Security-Policy": content_security_policy(nonce)}
    if request.method == "HEAD":
        return Response(b"", media_type="text/html; charset=utf-8", headers=headers)
    try:
        result = await pool.page(share.doc_gz, nonce)
    except Busy as exc:
        raise ApiError(503, str(exc), {"Retry-After": str(exc.retry_after)}) from None
    if result.status != 200:
        raise ApiError(result.status, result.sentence)
    return HTMLResponse(result.body, headers=headers)


@router.get("/p/{share_id}/", include_in_schema=False)
@router.head("/p/{share_id}/", include_in_schema=False)
async def share_slash(share_id: str) -> Response:
    if not ID_PATTERN.fullmatch(share_id):
        raise ApiError(404, "not found")
    return Response(status_code=308, headers={"Location": f"../{share_id}"})
