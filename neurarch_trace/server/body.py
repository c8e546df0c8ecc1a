"""Reading a request body on the event loop: headers checked first, then bytes within a limit.

Only cheap checks run here; parsing happens in a worker (:mod:`neurarch_trace.server.work`).
The body must declare ``Content-Type: application/json`` (or ``+json``): a body with none is a
415, since a cross-site form or ``fetch`` can send one without a CORS preflight. A
``Content-Encoding`` other than ``identity`` is a 415 too (compressed bodies would defeat the size
limit). The body is read in chunks and refused with 413 as soon as it passes ``max_body_bytes``
(or at once when ``Content-Length`` says it will).
"""

from __future__ import annotations

from fastapi import Request
from starlette.requests import ClientDisconnect

from neurarch_trace.server.errors import ApiError
from neurarch_trace.server.settings import Settings

__all__ = ["read_body"]

_JSON_ONLY = "the request body must be JSON (Content-Type: application/json)"


def _check_headers(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "the Content-Length header is not a number") from None
        if size > limit:
            raise ApiError(413, f"the request body is larger than this service accepts ({limit:,} bytes)")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not content_type:
        raise ApiError(415, _JSON_ONLY + "; this request has no Content-Type")
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise ApiError(415, _JSON_ONLY)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(415, f"the request body must not be compressed (Content-Encoding: {encoding[:40]} "
                            "is not accepted); send plain JSON")


async def read_body(request: Request, settings: Settings) -> bytes:
    """The raw body, or an :class:`ApiError` (400, 413 or 415)."""
    limit = settings.max_body_bytes
    _check_headers(request, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is larger than this service accepts ({limit:,} bytes)")
            chunks.append(chunk)
    except ClientDisconnect:  # the client left, or the transport cut it off (read timeouts): nobody to answer
        raise ApiError(408, "the request body did not arrive") from None
    return b"".join(chunks)
