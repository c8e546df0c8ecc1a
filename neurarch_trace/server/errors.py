"""Every error the service answers is ``{"error": "<one sentence>"}`` (``plan-api.md``, "Errors").

:class:`ApiError` is what route code raises; :func:`install_handlers` makes Starlette's own
errors (404, 405), FastAPI's validation errors and any unexpected exception answer the same shape,
never the default ``{"detail": ...}``, and never a traceback.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["ApiError", "error_response", "install_handlers", "validation_sentence"]

log = logging.getLogger("neurarch_trace.server")

_STATUS_SENTENCES = {
    400: "the request is malformed",
    401: "the API key is not valid",
    404: "not found",
    405: "method not allowed",
    408: "the request was not received in time",
    413: "the request body is too large",
    415: "the request body must be JSON (Content-Type: application/json)",
    429: "rate limit reached",
    500: "the plan service failed on this request",
    503: "the plan service is busy; retry shortly",
}


class ApiError(Exception):
    """An answer other than 2xx: ``status``, one ``sentence``, optional extra ``headers``."""

    def __init__(self, status: int, sentence: str, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(sentence)
        self.status = status
        self.sentence = sentence
        self.headers = headers or {}


def error_response(status: int, sentence: str, headers: Optional[dict[str, str]] = None) -> JSONResponse:
    """The JSON error answer; the sentence is cut to one line."""
    line = " ".join(str(sentence).split())
    return JSONResponse({"error": line}, status_code=status, headers=headers)


def validation_sentence(errors: Any) -> str:
    """One sentence for the first of pydantic's validation errors: ``'share' must be ...``."""
    if not errors:
        return "the request does not match the API"
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body",)]
    where = ".".join(loc) if loc else "the request body"
    if first.get("type") == "missing":
        return f"'{where}' is required"
    message = str(first.get("msg", "is invalid"))
    return f"'{where}' is invalid: {message[:1].lower() + message[1:]}"


def install_handlers(app: FastAPI) -> None:
    """Register the handlers on ``app``."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.sentence, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else ""
        sentence = _STATUS_SENTENCES.get(exc.status_code) or detail or "the request failed"
        return error_response(exc.status_code, sentence, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, validation_sentence(exc.errors()))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, _STATUS_SENTENCES[500])
