"""Ask a plan service for the card of a traced graph: ``POST {API}/api/v1/plan``.

This module imports no torch, so notebooks, CI jobs and the ``neurarch-trace plan`` command call it
without paying for the tracer. The contract it speaks is ``shared/spec/plan-api.md``::

    >>> from neurarch_trace.plan_client import request_plan
    >>> answer = request_plan(graph, share=True)       # graph: a loaded .neurarch.json dict
    >>> print(answer.text)                              # the card, verbatim
    >>> answer.url, answer.blocked                      # share link, blocker verdict

Nothing is sent unless :func:`request_plan` is called. Which service: ``NEURARCH_API`` (trailing slash
tolerated), default ``https://www.neurarch.com``; ``NEURARCH_API_KEY``, when set and non-empty, is
sent as a bearer token. Redirects are not followed: a redirected POST loses its body or its
``Authorization`` header, so a 3xx answer is reported as a status error naming where it points.

Every failure is raised as one of these, and ``str(error)`` is one line a user can act on::

    PlanError (NeurarchError)        base; also a NEURARCH_API that is not an http(s) URL
    ├── PlanConnectionError          no connection could be made (refused, DNS, TLS, reset)
    │   └── PlanTimeoutError         connecting, or waiting for the answer, took over `timeout` s
    ├── PlanStatusError              a non-2xx answer: .status_code and the server's own sentence
    │   └── PlanRateLimitError       429: anonymous callers are rate-limited; a key lifts it
    └── PlanResponseError            a 2xx answer that is not JSON, or has no string "text"

``requests`` exceptions are translated in one place (:func:`_post`) with ``raise ... from exc``, so
the original error stays reachable as ``__cause__``.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional
from urllib.parse import urlsplit

if TYPE_CHECKING:  # pragma: no cover
    import requests

from neurarch_trace._version import __version__
from neurarch_trace.errors import GraphError, NeurarchError
from neurarch_trace.text import one_line, wait_text

__all__ = [
    "DEFAULT_API",
    "DEFAULT_TIMEOUT",
    "COUNT_FIRST",
    "FAMILY_X",
    "GPU_COUNT",
    "MAX_GPUS",
    "MAX_USD_PER_HOUR",
    "PlanConnectionError",
    "PlanError",
    "PlanRateLimitError",
    "PlanResponse",
    "PlanResponseError",
    "PlanStatusError",
    "PlanTimeoutError",
    "api_base",
    "check_api",
    "check_plan_options",
    "gpu_count",
    "name_first",
    "api_host",
    "plan_blocked",
    "request_plan",
    "trace_source",
    "user_agent",
]

DEFAULT_API = "https://www.neurarch.com"
"""The hosted service. The ``www.`` matters: the apex domain redirects and drops ``Authorization``."""

DEFAULT_TIMEOUT = 30.0
"""Seconds allowed to connect, to wait for each piece of the answer (``requests`` semantics), and
for the whole body once its headers came."""

MAX_ANSWER_BYTES = 32 * 1024 * 1024
"""The largest answer read (bytes): a card and its plan are tens of kilobytes; a service that sends
more (or without end) is refused rather than read into memory."""

PLAN_PATH = "/api/v1/plan"
#: The request's ``attention`` values (``plan-api.md``).
ATTENTION_KINDS = ("sdpa", "flash", "eager")
FINETUNE_MODES = ("full", "lora", "qlora")
_MAX_SERVER_SENTENCE = 300  # characters of a server's error sentence kept in our one line


# --------------------------------------------------------------------------------------- errors


class PlanError(NeurarchError):
    """Base of every plan failure; ``str(err)`` is one line saying what happened and what to do."""


class PlanConnectionError(PlanError):
    """No connection to the service could be made: refused, unknown host, TLS failure, reset.

    Attributes: ``host`` (``name[:port]`` of the service), ``reason`` (short lower-case cause).
    """

    def __init__(self, message: str, *, host: str, reason: str) -> None:
        super().__init__(message)
        self.host = host
        self.reason = reason


class PlanTimeoutError(PlanConnectionError):
    """Connecting, or waiting for the answer, took longer than ``timeout`` seconds.

    Attributes: ``host``, ``reason``, ``timeout`` (the limit in seconds).
    """

    def __init__(self, message: str, *, host: str, reason: str, timeout: float) -> None:
        super().__init__(message, host=host, reason=reason)
        self.timeout = timeout


class PlanStatusError(PlanError):
    """The service answered a status other than 2xx.

    Attributes: ``host``, ``status_code`` (int), ``server_message`` (the service's own ``error``
    sentence, or None when the body carried none), ``location`` (the ``Location`` header of a 3xx).
    """

    def __init__(
        self,
        message: str,
        *,
        host: str,
        status_code: int,
        server_message: Optional[str],
        location: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.host = host
        self.status_code = status_code
        self.server_message = server_message
        self.location = location


class PlanRateLimitError(PlanStatusError):
    """429: the caller is rate-limited (per IP when anonymous). ``NEURARCH_API_KEY`` lifts it.

    Extra attribute: ``retry_after`` (seconds from the ``Retry-After`` header, or None).
    """

    def __init__(
        self,
        message: str,
        *,
        host: str,
        status_code: int,
        server_message: Optional[str],
        retry_after: Optional[float],
    ) -> None:
        super().__init__(
            message, host=host, status_code=status_code, server_message=server_message
        )
        self.retry_after = retry_after


class PlanResponseError(PlanError):
    """A 2xx answer the client cannot use: not JSON, not an object, no string ``text``, or a field
    of the wrong type. Attributes: ``host``, ``status_code``."""

    def __init__(self, message: str, *, host: str, status_code: int) -> None:
        super().__init__(message)
        self.host = host
        self.status_code = status_code


# ------------------------------------------------------------------------------------- response


@dataclass(frozen=True)
class PlanResponse:
    """The service's answer.

    ``text``: the card, plain text, to print verbatim. ``url``: the public share link, or None.
    ``share_error``: why no link came back although ``share`` was asked (the service's sentence, or
    one of ours when it gave none); None otherwise. ``plan``: the machine-readable facts
    (``plan.run.legal``, ``plan.run.blockers``, ``plan.model.params``, ``plan.cost.*``), or None when
    the service sent none. ``raw``: the whole decoded JSON object.
    """

    text: str
    url: Optional[str] = None
    share_error: Optional[str] = None
    plan: Optional[dict] = None
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def blockers(self) -> list:
        """``plan.run.blockers`` (a list, empty when none or when the answer carries no plan)."""
        run = (self.plan or {}).get("run")
        blockers = run.get("blockers") if isinstance(run, dict) else None
        return list(blockers) if isinstance(blockers, list) else []

    @property
    def blocked(self) -> Optional[bool]:
        """:func:`plan_blocked` of :attr:`plan`."""
        return plan_blocked(self.plan)

    def __str__(self) -> str:
        return self.text


def plan_blocked(plan: Optional[Mapping[str, Any]]) -> Optional[bool]:
    """The blocker verdict of a plan, as ``plan-api.md`` defines it: True when ``plan.run.legal``
    is false or ``plan.run.blockers`` is non-empty, False when the plan says it runs, None when
    there is no plan or it carries no ``run`` verdict to tell."""
    run = (plan or {}).get("run")
    if not isinstance(run, dict):
        return None
    legal, blockers = run.get("legal"), run.get("blockers")
    if legal is False or (isinstance(blockers, list) and blockers):
        return True
    if isinstance(legal, bool) or isinstance(blockers, list):
        return False
    return None


# ------------------------------------------------------------------------------ configuration


def api_base() -> str:
    """The service address: ``NEURARCH_API`` without trailing slashes, else :data:`DEFAULT_API`."""
    value = os.environ.get("NEURARCH_API", "").strip()
    return value.rstrip("/") if value else DEFAULT_API


def check_api(api: Optional[str] = None) -> str:
    """Return the service address (``api``, else :func:`api_base`) without trailing slashes.

    Raises:
        PlanError: the address is not an ``http://`` or ``https://`` URL with a host.
    """
    typed = api.strip() if api is not None else os.environ.get("NEURARCH_API", "").strip()
    base_url = api.strip().rstrip("/") if api is not None else api_base()
    source = "the plan service address" if api is not None else "NEURARCH_API"
    fix = f"set NEURARCH_API to one such as {DEFAULT_API}, or unset it"
    if any(ch.isspace() or not ch.isprintable() for ch in base_url):  # urlsplit keeps them in the host
        raise PlanError(f"{source} {typed!r} is not an http(s) URL: it contains a space or a control character; "
                        f"{fix}")
    try:
        parts = urlsplit(base_url)  # raises ValueError for a broken IPv6 literal (http://[::1)
        host = parts.hostname
    except ValueError:
        raise PlanError(f"{source} {typed!r} is not an http(s) URL: its host is malformed; {fix}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise PlanError(f"{source} {typed!r} is not an http(s) URL; {fix}")
    try:
        port = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise PlanError(f"{source} {typed!r} has a port that is not a number from 1 to 65535; {fix}")
    if parts.query or parts.fragment or base_url.endswith(("?", "#")):
        raise PlanError(f"{source} {typed!r} has a query or a fragment: give the service's base address, to "
                        f"which {PLAN_PATH} is added; {fix}")
    return base_url


def api_host(api: Optional[str] = None) -> str:
    """``host[:port]`` of a service address (default :func:`api_base`), for messages and notices.

    User info in the URL is never shown. An address with no host is returned as typed.
    """
    parts = urlsplit(api if api is not None else api_base())
    host = parts.hostname
    if not host:
        return api if api is not None else api_base()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def user_agent() -> str:
    """``neurarch-trace/<version>``: the User-Agent header and the ``source.tool`` field."""
    return f"neurarch-trace/{__version__}"


def trace_source(target: str, inputs: list[str]) -> dict:
    """The ``source`` block of a traced graph: the target as typed and the ``--input`` specs joined
    by one space (``"1,3,224,224"``, ``"1,128:long 1,128:long"``)."""
    return {"kind": "trace", "target": target, "input": " ".join(inputs), "tool": user_agent()}


# ------------------------------------------------------------------------------------- request


def request_plan(
    graph: Mapping[str, Any],
    *,
    share: bool = False,
    base: Optional[Mapping[str, Any]] = None,
    source: Optional[Mapping[str, Any]] = None,
    seq_len: Optional[int] = None,
    attention: Optional[str] = None,
    finetune: Optional[str] = None,
    context: Optional[int] = None,
    gpu: Optional[str] = None,
    usd_per_hour: Optional[float] = None,
    api: Optional[str] = None,
    api_key: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> PlanResponse:
    """Send ``graph`` to the plan service and return its answer.

    Args:
        graph: the ``.neurarch.json`` graph, as a dict (sent as ``model``).
        share: ask the service to store the graph and card at a public, unguessable URL. Anyone
            holding the link can open it; weights and source code are never in the graph.
        base: a second graph, the design being changed from; the card then includes a diff.
        source: where the graph came from (see :func:`trace_source`); sent as is.
        seq_len: tokens per sample for sizing, a positive int.
        attention: ``"sdpa"``, ``"flash"`` or ``"eager"`` (only eager stores the score matrix).
        finetune: ``"full"`` (default), ``"lora"`` or ``"qlora"``: what the card's fit and cost size.
        context: tokens of context to size serving for, a positive int.
        gpu: one card or cluster (``"H100"``, ``"H100x8"``, ``"8x H100"``, ``"RTX-4090"``); the service checks names.
        usd_per_hour: price per GPU-hour of ``gpu`` (for a card without a list price), a positive number.
        api: service address; default :func:`api_base` (``NEURARCH_API`` or the hosted service).
        api_key: bearer token; None reads ``NEURARCH_API_KEY``, ``""`` sends no key.
        timeout: seconds allowed to connect and to wait for each piece of the answer (default 30).

    Returns:
        :class:`PlanResponse`. When ``share`` was asked and no URL came back, ``url`` is None and
        ``share_error`` says why; that is not an exception, the card is still good.

    Raises:
        ValueError: an option above or ``timeout`` out of range (a programming error).
        GraphError: ``graph`` or ``base`` is not a dict, or holds a value JSON cannot carry.
        PlanError: ``api`` (or ``NEURARCH_API``) is not an http(s) URL. Subclasses, drawn in the
            module docstring: :class:`PlanConnectionError`, :class:`PlanTimeoutError`,
            :class:`PlanStatusError`, :class:`PlanRateLimitError`, :class:`PlanResponseError`.
    """
    gpu = name_first(gpu) if isinstance(gpu, str) else gpu  # 8x H100, as the card writes it: H100x8
    optional = {"seq_len": seq_len, "attention": attention, "finetune": finetune, "context": context, "gpu": gpu,
                "usd_per_hour": usd_per_hour}
    _check_options(optional)
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")

    base_url = check_api(api)
    host = api_host(base_url)

    body: dict[str, Any] = {"model": _graph_dict(graph, "graph"), "share": bool(share)}
    if source is not None:
        body["source"] = dict(source)
    if base is not None:
        body["base"] = _graph_dict(base, "base graph")
    body.update({name: value for name, value in optional.items() if value is not None})
    try:
        payload = json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise GraphError(f"the graph cannot be sent as JSON: {exc}") from exc

    key = os.environ.get("NEURARCH_API_KEY", "") if api_key is None else api_key
    key = key.strip()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": user_agent(),
    }
    if key:
        headers["Authorization"] = f"Bearer {key}"

    response = _post(base_url + PLAN_PATH, payload, headers, host=host, timeout=float(timeout))
    if not 200 <= response.status_code < 300:
        raise _status_error(response, host=host, key_sent=bool(key))
    return _parse_answer(response, host=host, share=bool(share))


#: The most GPUs a plan puts in one cluster (eight 8-GPU nodes) and the highest price per GPU-hour
#: the plan API takes: the reference service refuses more (``neurarch_trace/planner/gpus.py``,
#: ``MAX_GPUS``; ``neurarch_trace/server/schemas.py``), so a front end says so before anything is
#: traced or sent.
MAX_GPUS = 64
MAX_USD_PER_HOUR = 10_000
#: A count at the end of a ``gpu`` value: ``H100x8``, ``RTX 4090 x 2``, ``A100×4``, ``H100x-1``
#: (ASCII digits), after the last x; in ``RTX-4090`` the minus is part of the name (:func:`gpu_count`).
GPU_COUNT = re.compile(r"(?P<name>.*\S)(?P<space>\s*)[x\u00d7*]\s*(?P<count>-?[0-9]+)", flags=re.IGNORECASE)
#: The x of RTX, GTX and RX: written right after those letters, it is part of a card's name
#: (``RTX4090``, ``rtx 4090``, ``GTX 1080``), not a count's.
FAMILY_X = re.compile(r"(?:^|[^a-z])(?:rt|gt|r)$", flags=re.IGNORECASE)


#: A count written before the name, as the card writes clusters: ``8x H100``, ``2 × RTX-4090``.
COUNT_FIRST = re.compile(r"(?P<count>[0-9]+)\s*[x\u00d7*]\s*(?P<name>[a-z].*)", flags=re.IGNORECASE)


def name_first(gpu: str) -> str:
    """``gpu`` with a count written first moved after the name (``8x H100`` -> ``H100x8``), as the
    plan API's ``gpu`` takes it; any other value as given."""
    match = COUNT_FIRST.fullmatch(gpu.strip())
    return f"{match.group('name').strip()}x{match.group('count')}" if match else gpu


def gpu_count(gpu: str) -> int | None:
    """The count a ``gpu`` value asks for (``H100x8`` -> 8, ``RTX 4090 x 2`` -> 2, ``H100x0`` -> 0,
    ``H100x-1`` -> -1); ``None`` for a card name alone: the x of ``RTX4090`` or ``rtx 4090`` and the
    minus of ``RTX-4090`` are the name's."""
    match = GPU_COUNT.fullmatch(name_first(gpu).strip())
    if match is None:
        return None
    name, space = match.group("name"), match.group("space")
    if not space and FAMILY_X.search(name):
        return None
    count = int(match.group("count"))
    if count < 0 and not (space or name[-1].isdigit()):
        return None
    return count


def check_plan_options(options: Mapping[str, Any]) -> None:
    """Check the sizing options (``seq_len``, ``attention``, ``finetune``, ``context``, ``gpu``,
    ``usd_per_hour``; a missing one is None) as :func:`request_plan` checks them.

    Raises:
        ValueError: a value of the wrong type or out of range.
    """
    _check_options({k: options.get(k) for k in ("seq_len", "attention", "finetune", "context", "gpu",
                                                "usd_per_hour")})


def _check_options(options: dict) -> None:
    """The optional fields' types and ranges (the service checks the values it knows, such as GPU names)."""
    seq_len, attention, finetune, context, gpu, usd_per_hour = (
        options[k] for k in ("seq_len", "attention", "finetune", "context", "gpu", "usd_per_hour"))
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    if attention is not None and attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")
    if finetune is not None and finetune not in FINETUNE_MODES:
        raise ValueError(f"finetune must be one of {', '.join(FINETUNE_MODES)}, got {finetune!r}")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 1):
        raise ValueError(f"context must be a positive int, got {context!r}")
    if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
        raise ValueError(f"gpu must be a card name such as H100 or H100x8, got {gpu!r}")
    count = gpu_count(gpu) if gpu is not None else None
    if count is not None and count < 0:
        raise ValueError(f"gpu {gpu.strip()!r} asks for a negative number of cards; a plan uses 1 to {MAX_GPUS}")
    if count is not None and not 1 <= count <= MAX_GPUS:
        raise ValueError(f"gpu {gpu.strip()!r} asks for {count:,} cards; a plan uses 1 to {MAX_GPUS}")
    if usd_per_hour is not None and (isinstance(usd_per_hour, bool) or not isinstance(usd_per_hour, (int, float))
                                     or not math.isfinite(usd_per_hour) or not 0 < usd_per_hour <= MAX_USD_PER_HOUR):
        raise ValueError(f"usd_per_hour must be a positive number of at most {MAX_USD_PER_HOUR:,}, "
                         f"got {usd_per_hour!r}")


def _graph_dict(graph: Any, what: str) -> dict:
    if not isinstance(graph, Mapping):
        raise GraphError(f"the {what} must be a dict (a loaded .neurarch.json), got {type(graph).__name__}")
    return dict(graph)


def _post(
    url: str, payload: bytes, headers: dict, *, host: str, timeout: float
) -> requests.Response:
    """The one boundary where ``requests`` exceptions become :class:`PlanError` subclasses (with
    :func:`_read_body`, which reads the answer's body into the response returned).

    ``requests`` is imported here, on the first plan, not with this module: the command line reads
    these options on every run, and a trace that plans nothing never pays for the HTTP stack."""
    import requests

    try:
        # Streamed: the body is read by _read_body, within a size and a time limit.
        response = requests.post(
            url, data=payload, headers=headers, timeout=timeout, allow_redirects=False, stream=True
        )
    except requests.exceptions.ConnectTimeout as exc:  # before ConnectionError: it is both
        raise PlanTimeoutError(
            f"could not connect to the plan service at {host} within {timeout:g} seconds",
            host=host, reason="connect timeout", timeout=timeout,
        ) from exc
    except requests.exceptions.Timeout as exc:
        raise _read_timeout(host, timeout) from exc
    except requests.exceptions.ConnectionError as exc:
        if _is_read_timeout(exc):  # requests reports a stall inside the body this way
            raise _read_timeout(host, timeout) from exc
        reason = _connection_reason(exc)
        raise PlanConnectionError(
            f"could not connect to the plan service at {host}: {reason}", host=host, reason=reason
        ) from exc
    except requests.exceptions.RequestException as exc:
        reason = _connection_reason(exc)
        raise PlanConnectionError(
            f"the request to the plan service at {host} failed: {reason}", host=host, reason=reason
        ) from exc
    _read_body(response, host=host, timeout=timeout)
    return response


def _read_body(response: requests.Response, *, host: str, timeout: float) -> None:
    """Read the answer's body into ``response`` (``.content``, ``.text``, ``.json()`` then work as
    for an unstreamed one): at most :data:`MAX_ANSWER_BYTES`, within ``timeout`` seconds in all.

    Raises:
        PlanResponseError: the body is larger than :data:`MAX_ANSWER_BYTES`.
        PlanTimeoutError: the body took longer than ``timeout`` seconds, or stalled.
        PlanConnectionError: the connection broke inside the body.
    """
    import time

    import requests
    from urllib3.exceptions import HTTPError

    deadline = time.monotonic() + timeout
    body = bytearray()
    raw = response.raw
    # urllib3 2's read1 returns what has come (a dribbling body meets the deadline between pieces);
    # iter_content, for an older urllib3, waits for whole pieces of 64 KiB
    chunks = (iter(lambda: raw.read1(64 * 1024, decode_content=True), b"") if hasattr(raw, "read1")
              else response.iter_content(chunk_size=64 * 1024))
    try:
        for chunk in chunks:
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise PlanResponseError(
                    f"the plan service at {host} sent an answer over {MAX_ANSWER_BYTES // 2 ** 20} MiB (a plan is "
                    "tens of kilobytes); check NEURARCH_API points at a neurarch plan service",
                    host=host, status_code=response.status_code)
            if time.monotonic() > deadline:
                raise _read_timeout(host, timeout)
    except (requests.exceptions.RequestException, HTTPError, OSError) as exc:  # a stall, a reset, a cut body
        if isinstance(exc, requests.exceptions.Timeout) or _is_read_timeout(exc):
            raise _read_timeout(host, timeout) from exc
        reason = "connection broken inside the answer"
        raise PlanConnectionError(f"the connection to the plan service at {host} broke before the whole answer "
                                  "came; try again", host=host, reason=reason) from exc
    finally:
        response.close()
    response._content = bytes(body)  # what requests itself sets when it reads a body
    response._content_consumed = True


def _read_timeout(host: str, timeout: float) -> PlanTimeoutError:
    return PlanTimeoutError(
        f"the plan service at {host} did not answer within {timeout:g} seconds; try again later",
        host=host, reason="read timeout", timeout=timeout,
    )


def _is_read_timeout(exc: BaseException) -> bool:
    from urllib3.exceptions import ReadTimeoutError

    return any(isinstance(e, ReadTimeoutError) for e in _exception_chain(exc))


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its first argument when that is an exception, urllib3's ``reason``, and the
    ``__cause__``/``__context__`` chain, depth first, each once."""
    seen: list[BaseException] = []
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or any(item is s for s in seen):
            continue
        seen.append(item)
        stack.extend([item.__context__, item.__cause__, getattr(item, "reason", None)])
        stack.extend(a for a in reversed(item.args) if isinstance(a, BaseException))
    return seen


def _connection_reason(exc: BaseException) -> str:
    """A short lower-case cause (``connection refused``, ``name or service not known``) taken from
    the deepest OS error in the chain, instead of urllib3's multi-part repr."""
    import ssl

    for e in _exception_chain(exc):
        if isinstance(e, ssl.SSLError):
            return "TLS handshake failed (" + (e.reason or type(e).__name__).lower().replace("_", " ") + ")"
        if isinstance(e, OSError) and isinstance(e.strerror, str) and e.strerror:
            return _lower_first(e.strerror)
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(exc))
    if match:
        return _lower_first(match.group(1).strip())
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError):
        return "the connection failed or was closed before an answer came"
    return _one_line(str(exc)) or type(exc).__name__


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _one_line(text: str) -> str:
    """A server's sentence on one line, at most 300 characters."""
    return one_line(text, _MAX_SERVER_SENTENCE)


def _decode_json(response: requests.Response) -> Any:
    """The body as JSON, or raises ValueError."""
    return json.loads(response.content)  # bytes: json detects UTF-8/16/32 itself


def _server_sentence(response: requests.Response) -> Optional[str]:
    """The service's own ``error`` sentence (``detail`` as a fallback), or None."""
    try:
        body = _decode_json(response)
    except ValueError:
        return None
    if isinstance(body, dict):
        for key in ("error", "detail"):
            value = body.get(key)
            if isinstance(value, str) and value.strip():
                return _one_line(value).rstrip(".")
    return None


def _loopback(host: str) -> bool:
    """Whether ``host`` (``name[:port]``, an IPv6 address in brackets) is this machine."""
    name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a name, not an address
        return name.lower() == "localhost"


def _status_error(response: requests.Response, *, host: str, key_sent: bool) -> PlanStatusError:
    code = response.status_code
    sentence = _server_sentence(response)
    said = f"{code}: {sentence}" if sentence else (
        f"{code} {response.reason} with no error message" if response.reason else
        f"{code} with no error message"
    )
    prefix = f"the plan service at {host} answered {said}"
    if code == 429:
        retry_after = _retry_after(response.headers.get("Retry-After"))
        message = prefix
        if key_sent:
            message += "; the API key sent did not lift the limit; check NEURARCH_API_KEY"
        elif "NEURARCH_API_KEY" not in (sentence or ""):  # the service may already have said it
            message += "; set NEURARCH_API_KEY to an API key the service issued to lift the limit"
        if retry_after is not None:
            message += f", or retry in {wait_text(retry_after)}"
        if _loopback(host):  # a service on this machine: most likely one the user started
            message += "; a service you run yourself plans without a limit with `neurarch-trace serve --rate-limit 0`"
        return PlanRateLimitError(
            message, host=host, status_code=code, server_message=sentence, retry_after=retry_after
        )
    if 300 <= code < 400:
        location = response.headers.get("Location")
        where = f" to {location}" if location else ""
        return PlanStatusError(
            f"the plan service at {host} answered {code}, a redirect{where}; "
            "set NEURARCH_API to the address it points at",
            host=host, status_code=code, server_message=sentence, location=location,
        )
    advice = ""
    if code in (401, 403):
        advice = "; check NEURARCH_API_KEY" if key_sent else "; set NEURARCH_API_KEY to an API key"
    elif code in (404, 405):  # no plan API at that path: an address with a path of its own (.../api)
        path = urlsplit(response.url or "").path
        where = f" (it has no {path})" if path else ""
        advice = (f"; is this a plan service{where}? NEURARCH_API is the service's base address, "
                  f"to which {PLAN_PATH} is added")
    return PlanStatusError(prefix + advice, host=host, status_code=code, server_message=sentence)


def _retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` in seconds; the HTTP-date form is ignored (None)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def _parse_answer(response: requests.Response, *, host: str, share: bool) -> PlanResponse:
    code = response.status_code

    def malformed(what: str) -> PlanResponseError:
        return PlanResponseError(
            f"the plan service at {host} answered {code} {what}", host=host, status_code=code
        )

    try:
        body = _decode_json(response)
    except ValueError as exc:
        kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        what = "an HTML page" if kind == "text/html" else (
            f"a body that is not JSON ({kind})" if kind else "a body that is not JSON"
        )
        raise malformed(f"with {what}; the address may not be a plan service") from exc
    if not isinstance(body, dict):
        raise malformed(f"with JSON that is not an object ({type(body).__name__})")
    text = body.get("text")
    if not isinstance(text, str):
        raise malformed('without a card (no string "text" in its JSON)')
    for name, kind in (("url", str), ("share_error", str), ("plan", dict)):
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise malformed(f'with a "{name}" that is not a{"n object" if kind is dict else " string"}')
    url = body.get("url") or None
    share_error = body.get("share_error") or None
    if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname
                            or any(ch.isspace() or ord(ch) < 32 for ch in url)):
        # only a web link is handed on: a javascript: or data: URL would run in a notebook's page
        share_error = f"the service returned a share link that is not an http(s) URL ({_one_line(url)[:80]!r})"
        url = None
    if share and url is None and share_error is None:
        share_error = "the service returned no share URL and gave no reason"
    if share_error is not None:
        share_error = _one_line(share_error)
    return PlanResponse(text=text, url=url, share_error=share_error, plan=body.get("plan"), raw=body)
