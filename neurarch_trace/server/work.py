"""What a worker process does with a request: parse, validate, plan, serialise, compress.

Runs in the service's worker processes (:mod:`neurarch_trace.server.pool`), never on the event
loop: every step here is pure-Python CPU work. Each job runs under a CPU-time budget measured by
the kernel (``setitimer(ITIMER_PROF)``: user plus system time of this single-threaded process),
so a request is bounded by what its work costs, whatever its shape: over the budget the job stops
with :class:`BudgetExceeded` and the service answers 413.

Parsing is strict: the standard library's ``json`` with ``NaN``/``Infinity`` refused, numbers that
overflow to infinity (``1e309``) refused, integers beyond 2**63 refused, nesting limited, strings
that are not text (unpaired surrogates) refused. Everything written back is strict JSON.
"""

from __future__ import annotations

import gzip
import json
import math
import secrets
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from pydantic import ValidationError

from neurarch_trace.errors import GraphError
from neurarch_trace.planner import OptionError, make_plan
from neurarch_trace.server.errors import ApiError, validation_sentence
from neurarch_trace.server.page import render_share_page
from neurarch_trace.server.schemas import PlanRequest
from neurarch_trace.server.store import ID_BYTES, strict_json

__all__ = ["BudgetExceeded", "JobResult", "json_problem", "page_job", "parse_json", "plan_job"]

#: Largest integer magnitude accepted anywhere in a request (int64, what databases and most JSON
#: readers hold exactly enough to compare).
MAX_INT = 2**63
#: gzip level of stored shares: 6 is zlib's default balance (level 9 saves ~2% for 2x the time).
GZIP_LEVEL = 6


class BudgetExceeded(Exception):
    """The job used its CPU-time budget."""


@dataclass(frozen=True)
class JobResult:
    """``status`` 200 with ``body`` (JSON or HTML bytes), or an error ``status`` and ``sentence``.
    ``share`` is ``(id, created, gzip document)`` when a share was asked and planned;
    ``over_budget`` marks a 413 that came from the CPU budget (the pool may retry elsewhere)."""

    status: int
    body: bytes = b""
    sentence: str = ""
    share: Optional[tuple[str, float, bytes]] = None
    over_budget: bool = False
    cpu_s: float = 0.0


class _NumberError(ValueError):
    """A number that parses but that the service refuses (``str()`` ends the sentence)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NumberError(f"has the number {_short(text)}, which is not finite as a 64-bit float "
                           "(numbers must be finite)")
    return value


def _bounded_int(text: str) -> int:
    value = int(text)  # ValueError past 4300 digits
    if not -MAX_INT < value < MAX_INT:
        raise _NumberError(f"has the integer {_short(text)}, beyond 2^63 in magnitude")
    return value


def json_problem(value: Any, limit: int) -> Optional[str]:
    """Why the parsed ``value`` is refused, or ``None``: nesting deeper than ``limit``, or a string
    with an unpaired UTF-16 surrogate (legal JSON escapes, but not text: it cannot be stored or
    answered as UTF-8). Iterative, so no input can exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
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


def parse_json(raw: bytes, max_depth: int) -> Any:
    """The parsed body, or :class:`ApiError` 400 with one sentence."""
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object with a 'model' graph")
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno})") from None
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {max_depth} levels") from None
    except _NumberError as exc:
        raise ApiError(400, f"the request body {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc})") from None
    problem = json_problem(value, max_depth)
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


def _on_budget(signum: int, frame: Any) -> None:
    raise BudgetExceeded()


def _budget_sentence(budget_s: float) -> str:
    return (f"the plan needs more than {budget_s:g} s of CPU time, this service's limit per request; "
            "send a smaller graph or plan it on your own service (neurarch-trace serve --plan-budget-s)")


def _run_budgeted(budget_s: float, job: Any, *args: Any) -> JobResult:
    """``job(*args)`` under a CPU-time budget; errors become results (nothing raises out)."""
    started = time.process_time()
    previous = signal.signal(signal.SIGPROF, _on_budget)
    try:
        try:
            signal.setitimer(signal.ITIMER_PROF, budget_s)
            result: JobResult = job(*args)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except BudgetExceeded:
        return JobResult(413, sentence=_budget_sentence(budget_s), over_budget=True,
                         cpu_s=time.process_time() - started)
    except ApiError as exc:
        return JobResult(exc.status, sentence=exc.sentence, cpu_s=time.process_time() - started)
    except MemoryError:
        return JobResult(413, sentence="the plan needs more memory than this service allows one request; "
                                       "send a smaller graph", cpu_s=time.process_time() - started)
    finally:
        signal.signal(signal.SIGPROF, previous)
    return JobResult(result.status, result.body, result.sentence, result.share, cpu_s=time.process_time() - started)


def _plan(raw: bytes, max_depth: int) -> JobResult:
    body = parse_plan_request(parse_json(raw, max_depth))
    source = body.source.model_dump() if body.source is not None else None
    try:
        answer = make_plan(body.model, source=source, base=body.base, seq_len=body.seq_len, attention=body.attention,
                           finetune=body.finetune, context=body.context, gpu=body.gpu, usd_per_hour=body.usd_per_hour)
    except (GraphError, OptionError) as exc:  # a bad graph, or a bad option (an unknown gpu)
        raise ApiError(422, str(exc)) from None
    except OverflowError:
        raise ApiError(422, "a number in the graph is too large to plan: the plan overflows a 64-bit float") from None
    try:
        response = strict_json({"text": answer["text"], "plan": answer["plan"]}).encode("utf-8")
    except ValueError:
        raise ApiError(422, "a number in the graph is too large to plan: the plan overflows a 64-bit float") from None
    share = None
    if body.share:
        share_id = secrets.token_urlsafe(ID_BYTES)
        now = time.time()
        created = datetime.fromtimestamp(now, timezone.utc).replace(microsecond=0).isoformat()
        doc = ('{"id":' + json.dumps(share_id) + ',"created":' + json.dumps(created) + ","
               + response.decode("utf-8")[1:-1] + ',"graph":' + strict_json(body.model) + "}")
        share = (share_id, now, gzip.compress(doc.encode("utf-8"), compresslevel=GZIP_LEVEL, mtime=0))
    return JobResult(200, response, share=share)


def plan_job(raw: bytes, max_depth: int, budget_s: float) -> JobResult:
    """Plan the raw request body ``raw`` (bytes of JSON) within ``budget_s`` CPU seconds. The 200
    body is ``{"text", "plan"}`` as strict JSON; with ``share`` the result carries the share."""
    return _run_budgeted(budget_s, _plan, raw, max_depth)


def _page(doc_gz: bytes, nonce: str) -> JobResult:
    doc = json.loads(gzip.decompress(doc_gz))
    page = render_share_page(doc["id"], doc["created"], doc["text"], doc["plan"], nonce=nonce)
    return JobResult(200, page.encode("utf-8"))


def page_job(doc_gz: bytes, nonce: str, budget_s: float) -> JobResult:
    """The share page (HTML bytes) of a stored document, its script tag carrying ``nonce``, within
    ``budget_s`` CPU seconds."""
    return _run_budgeted(budget_s, _page, doc_gz, nonce)
