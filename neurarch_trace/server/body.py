"""Reading a JSON request body within limits: size, nesting depth, then the request's own fields.

The body is read in chunks and refused with 413 as soon as it passes ``max_body_bytes`` (or at
once when ``Content-Length`` says it will); it is parsed with the standard library, whose errors
(syntax, too-deep recursion, integers with more than 4300 digits, ``NaN``/``Infinity``) all become
a 400; a walk over the parsed value refuses nesting deeper than ``max_depth`` and strings that are
not text (unpaired surrogates). Graph counts are checked before any
planning starts. No limit here takes time beyond linear in the body.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional, Tuple

from fastapi import Request
from pydantic import ValidationError

from neurarch_trace.server.errors import ApiError, validation_sentence
from neurarch_trace.server.schemas import PlanRequest
from neurarch_trace.server.settings import Settings

__all__ = ["check_graph_counts", "json_problem", "parse_plan_request", "read_json"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_problem(value: Any, limit: int) -> Optional[str]:
    """Why the parsed ``value`` is refused, or ``None``: nesting deeper than ``limit``, or a string
    with an unpaired UTF-16 surrogate (legal JSON escapes, but not text: it cannot be stored or
    answered as UTF-8). Iterative, so no input can exhaust the stack."""
    stack: List[Tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return "the request body contains a string with an unpaired surrogate"
            continue
        if isinstance(item, dict):
            children: Any = list(item.keys()) + list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return f"the request body nests deeper than {limit} levels"
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            elif isinstance(child, str):
                stack.append((child, depth))
    return None


async def read_json(request: Request, settings: Settings) -> Any:
    """The parsed JSON body, or an :class:`ApiError` (413, 415 or 400)."""
    limit = settings.max_body_bytes
    too_large = ApiError(413, f"the request body is larger than this service accepts ({limit:,} bytes)")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_large
        except ValueError:
            raise ApiError(400, "the Content-Length header is not a number") from None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type and content_type != "application/json" and not content_type.endswith("+json"):
        raise ApiError(415, "the request body must be JSON (Content-Type: application/json)")
    chunks: List[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object with a 'model' graph")
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno})") from None
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {settings.max_depth} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc})") from None
    problem = json_problem(value, settings.max_depth)
    if problem is not None:
        raise ApiError(400, problem)
    return value


def parse_plan_request(value: Any) -> PlanRequest:
    """Check the request's fields and types (422 with one sentence when they are wrong)."""
    if not isinstance(value, dict):
        raise ApiError(422, "the request body must be a JSON object with a 'model' graph")
    try:
        return PlanRequest.model_validate(value)
    except ValidationError as exc:
        raise ApiError(422, validation_sentence(exc.errors())) from None


def check_graph_counts(graph: Any, what: str, settings: Settings) -> None:
    """Refuse a graph with more components or connections than the service plans (413)."""
    if not isinstance(graph, dict):
        return  # the planner says why it is not a graph
    for key, limit in (("components", settings.max_components), ("connections", settings.max_connections)):
        items = graph.get(key)
        if isinstance(items, list) and len(items) > limit:
            raise ApiError(413, f"the {what} has {len(items):,} {key}; this service plans at most {limit:,}")
