"""The command-line front end of the plan client: ``--plan``/``--share`` and ``neurarch-trace plan``.

Thin over :mod:`neurarch_trace.plan_client`; imports no torch. The trace command (``cli.py``) uses
it in three steps::

    add_plan_arguments(parser)                 # --plan --share --base FILE --fail-on-block
    base = check_plan_arguments(args)          # before tracing: -o - clash, --base file, NEURARCH_API
    ...trace, write the graph, print "wrote ..." on stderr...
    return run_plan(args, graph, path, target=..., inputs=..., base=base)

and ``neurarch-trace plan FILE.neurarch.json [--share] [--base FILE] [--fail-on-block]`` re-plans a
saved graph without tracing (:func:`plan_main`).

Streams: stdout carries only the card, verbatim, and, when shared, a last line ``Share: <url>``.
stderr carries the notice naming the host and what is sent, and every ``neurarch-trace: ...`` line.

Exit codes of :func:`run_plan` and :func:`plan_main`: 0 once the card printed (also when a share was
asked and no link came back: one stderr line says why); 1 for a plan failure (connection, timeout,
non-2xx, malformed answer; the line says the graph is still on disk at its path) or a bad graph
file; 2 with ``--fail-on-block`` when the plan reports a blocker.

Privacy: nothing is sent unless ``--plan`` or ``--share`` was given (``plan`` implies ``--plan``).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, NoReturn, Optional

from neurarch_trace.errors import NeurarchError
from neurarch_trace.graph import graph_summary, read_graph
from neurarch_trace.plan_client import (
    PlanResponse,
    api_host,
    check_api,
    request_plan,
    trace_source,
    user_agent,
)

__all__ = ["add_plan_arguments", "check_plan_arguments", "plan_main", "run_plan", "wants_plan"]

PROG = "neurarch-trace"


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--plan``, ``--share``, ``--base FILE``, ``--fail-on-block``, ``--seq-len N`` and
    ``--attention KIND`` to the trace parser.

    Destinations: ``args.plan``, ``args.share`` (bools), ``args.base`` (path or None),
    ``args.fail_on_block`` (bool), ``args.seq_len`` (int or None), ``args.attention`` (str or None).
    """
    group = parser.add_argument_group(
        "plan", "send the traced graph to a plan service (NEURARCH_API, default www.neurarch.com)"
    )
    group.add_argument(
        "--plan",
        action="store_true",
        help="send the graph to the plan service and print the card it returns; "
        "nothing is sent without --plan or --share",
    )
    _add_share_base_fail(group)


def _add_share_base_fail(group: Any) -> None:
    group.add_argument(
        "--share",
        action="store_true",
        help="implies --plan; also store the graph and card at a public, unguessable URL "
        "(anyone with the link can open it; never weights or source) and print 'Share: <url>' last",
    )
    group.add_argument(
        "--base",
        metavar="FILE",
        default=None,
        help="a second .neurarch.json graph, the design being changed from; the card adds a diff",
    )
    group.add_argument(
        "--fail-on-block",
        action="store_true",
        help="exit 2 when the plan reports a blocker (the graph would not run)",
    )
    group.add_argument(
        "--seq-len",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokens per sample to size a token model for (default: the traced length)",
    )
    group.add_argument(
        "--attention",
        choices=("sdpa", "flash", "eager"),
        default=None,
        help="the attention kernel training will use (default sdpa); only eager keeps the "
        "attention score matrices in memory",
    )
    group.add_argument(
        "--finetune",
        type=_finetune,
        default=None,
        metavar="MODE",
        help="what the card's fit and cost size: full training (default), lora or qlora fine-tuning",
    )
    group.add_argument(
        "--context",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokens of context to size serving for (default: the model's maximum, else the traced length)",
    )
    group.add_argument(
        "--gpu",
        default=None,
        metavar="NAME[xN]",
        help="plan for this card or cluster only, e.g. H100, H100x8, RTX-4090 (cards you own included)",
    )
    group.add_argument(
        "--usd-per-hour",
        type=_price,
        default=None,
        metavar="USD",
        help="price per GPU-hour of the --gpu card, for a card without a list price",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of tokens")
    return value


def _finetune(text: str) -> str:
    if text not in ("full", "lora", "qlora"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fine-tuning mode: use full, lora or qlora")
    return text


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars per GPU-hour") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive price per GPU-hour")
    return value


_SIZING = (("finetune", "finetune"), ("context", "context"), ("gpu", "gpu"), ("usd_per_hour", "usd_per_hour"))


def wants_plan(args: argparse.Namespace) -> bool:
    """True when the user asked for anything to be sent (``--plan`` or ``--share``)."""
    return bool(getattr(args, "plan", False) or getattr(args, "share", False))


def check_plan_arguments(args: argparse.Namespace) -> Optional[dict]:
    """Validate the plan flags before any tracing; return the loaded ``--base`` graph or None.

    Reads ``args.plan``, ``args.share``, ``args.base``, ``args.fail_on_block`` and ``args.output``
    (the ``-o`` value; ``"-"`` means stdout).

    Raises:
        NeurarchError: one line, when ``-o -`` is combined with ``--plan``/``--share`` (stdout is
            the card's), when ``--base`` or ``--fail-on-block`` comes without ``--plan``/``--share``,
            when ``NEURARCH_API`` is not an http(s) URL (:class:`~neurarch_trace.plan_client.PlanError`),
            or when the ``--base`` file is missing, not JSON or not a graph
            (:class:`~neurarch_trace.errors.GraphError`).
    """
    base_path = getattr(args, "base", None)
    if not wants_plan(args):
        if base_path is not None:
            raise NeurarchError("--base needs --plan or --share: it is what the plan's diff compares to")
        for flag, dest in (("--seq-len", "seq_len"), ("--attention", "attention"), ("--finetune", "finetune"),
                           ("--context", "context"), ("--gpu", "gpu"), ("--usd-per-hour", "usd_per_hour")):
            if getattr(args, dest, None) is not None:
                raise NeurarchError(f"{flag} needs --plan or --share: it sizes the plan")
        if getattr(args, "fail_on_block", False):
            raise NeurarchError("--fail-on-block needs --plan or --share: it reads the plan's verdict")
        return None
    flag = "--share" if getattr(args, "share", False) else "--plan"
    if getattr(args, "output", None) == "-":
        raise NeurarchError(
            f"-o - cannot be combined with {flag}: stdout carries the card; "
            "write the graph to a file with -o FILE"
        )
    if getattr(args, "usd_per_hour", None) is not None and getattr(args, "gpu", None) is None:
        raise NeurarchError("--usd-per-hour needs --gpu: it prices the card named there")
    check_api()
    if base_path is None:
        return None
    try:
        return read_graph(base_path)
    except NeurarchError as err:
        raise type(err)(f"--base: {err}") from err


def run_plan(
    args: argparse.Namespace,
    graph: dict,
    graph_path: Optional[str],
    *,
    target: str,
    inputs: list[str],
    base: Optional[dict],
) -> int:
    """Plan a freshly traced graph and print the card; return the exit code (0, 1 or 2).

    Call it after the graph was written to ``graph_path`` and ``wrote ...`` was printed. ``target``
    is the target as typed, ``inputs`` the ``--input`` specs as typed, ``base`` what
    :func:`check_plan_arguments` returned. Returns 0 at once, sending nothing, unless ``--plan`` or
    ``--share`` was given. Never raises for a plan failure: it prints ``neurarch-trace: <line>`` on
    stderr and returns 1.
    """
    if not wants_plan(args):
        return 0
    return _plan_and_print(
        graph,
        graph_path,
        share=bool(getattr(args, "share", False)),
        base=base,
        source=trace_source(target, list(inputs)),
        fail_on_block=bool(getattr(args, "fail_on_block", False)),
        verbose=bool(getattr(args, "verbose", False)),
        seq_len=getattr(args, "seq_len", None),
        attention=getattr(args, "attention", None),
        sizing={key: getattr(args, dest, None) for key, dest in _SIZING},
    )


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line and exit code 1, as the trace command does, so that
    exit 2 keeps meaning "blocked" under --fail-on-block."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{PROG}: {message} (see {self.prog} --help)\n")


def _plan_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"{PROG} plan",
        description="Re-plan a saved .neurarch.json graph without tracing again: send it to the plan "
        "service (NEURARCH_API, default www.neurarch.com) and print the card it returns.",
        epilog="Exit codes: 0 card printed; 1 bad graph file or the plan failed (the graph file is "
        "untouched); 2 with --fail-on-block when the plan reports a blocker.",
    )
    parser.add_argument("graph", metavar="FILE.neurarch.json", help="the graph to plan")
    _add_share_base_fail(parser)
    parser.add_argument(
        "--verbose", action="store_true", help="on failure, also print the underlying error chain"
    )
    return parser


def plan_main(argv: list[str]) -> int:
    """``neurarch-trace plan FILE [--share] [--base FILE] [--fail-on-block] [--verbose]``.

    ``argv`` is what follows ``plan``. Returns the exit code (0, 1 or 2, as :func:`run_plan`; a
    usage error prints one line and exits 1). The graph and the ``--base`` file are read and checked
    before anything is sent.
    """
    args = _plan_parser().parse_args(argv)
    try:
        return _plan_command(args)
    except KeyboardInterrupt:
        _error("interrupted")
        return 1
    except Exception as exc:  # noqa: BLE001 - a fault of ours: one line, traceback with --verbose
        if args.verbose:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        _error(f"internal error: {type(exc).__name__}: {exc} (run again with --verbose and report it)")
        return 1


def _plan_command(args: argparse.Namespace) -> int:
    args.plan = True
    args.output = None
    try:
        graph = read_graph(args.graph)
        base = check_plan_arguments(args)
    except NeurarchError as err:
        _error(str(err))
        return 1
    # The card is headed by source.target: the file's name, not its folders (they stay private).
    source = {"kind": "file", "target": os.path.basename(args.graph), "tool": user_agent()}
    return _plan_and_print(
        graph,
        args.graph,
        share=args.share,
        base=base,
        source=source,
        fail_on_block=args.fail_on_block,
        verbose=args.verbose,
        seq_len=args.seq_len,
        attention=args.attention,
        sizing={key: getattr(args, dest) for key, dest in _SIZING},
    )


def _plan_and_print(
    graph: dict,
    graph_path: Optional[str],
    *,
    share: bool,
    base: Optional[dict],
    source: dict,
    fail_on_block: bool,
    verbose: bool,
    seq_len: Optional[int] = None,
    attention: Optional[str] = None,
    sizing: Optional[dict] = None,
) -> int:
    print(_notice(graph, base, share), file=sys.stderr, flush=True)
    try:
        answer = request_plan(graph, share=share, base=base, source=source, seq_len=seq_len, attention=attention,
                              **{k: v for k, v in (sizing or {}).items() if v is not None})
    except NeurarchError as err:
        if verbose:
            traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
        still = f"; the graph is still at {graph_path}" if graph_path else ""
        _error(f"{err}{still}")
        return 1
    _print_card(answer, share)
    if share and answer.url is None:
        _error(f"no share link: {answer.share_error}")
    if not fail_on_block:
        return 0
    blocked = answer.blocked
    if blocked is None:
        _error("the plan carries no plan.run verdict, so --fail-on-block cannot tell whether the "
               "graph is blocked")
        return 1
    if blocked:
        n = len(answer.blockers)
        what = f"{n} blocker{'s' if n != 1 else ''}" if n else "that the graph would not run"
        _error(f"the plan reports {what}; exit 2 (--fail-on-block)")
        return 2
    return 0


def _notice(graph: dict, base: Optional[dict], share: bool) -> str:
    """``Sending the graph (62 layers) to www.neurarch.com for the plan; add --share for ...``."""
    what = f"the graph ({_layers(graph)})"
    if base is not None:
        what += f" and the base graph ({_layers(base)})"
    purpose = (
        "for the plan and a public share link (anyone with the link can open it)"
        if share
        else "for the plan; add --share for a public link"
    )
    return f"Sending {what} to {api_host()} {purpose}."


def _layers(graph: dict) -> str:
    n = graph_summary(graph)["layers"]
    return f"{n} layer{'s' if n != 1 else ''}"


def _terminal_safe(text: str) -> str:
    # the card as the service rendered it, less control characters a service could use to drive
    # the terminal (escape sequences); newlines stay
    return "".join(ch if ch.isprintable() or ch == "\n" else " " for ch in text)


def _print_card(answer: PlanResponse, share: bool) -> None:
    text = _terminal_safe(answer.text)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    if share and answer.url is not None:
        sys.stdout.write(f"Share: {answer.url}\n")
    sys.stdout.flush()


def _error(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
