"""The plan half of the command line: ``--plan``/``--share`` on the trace command, and the body of
``neurarch-trace plan``.

Thin over :mod:`neurarch_trace.plan_options` (the options, their checks, the consent notice) and
:mod:`neurarch_trace.plan_client`; imports no torch. The trace command (``cli.py``) uses it in
three steps::

    add_plan_arguments(parser)                 # --plan --share --base FILE --fail-on-block ...
    base = check_plan_arguments(args)          # before tracing: -o - clash, --base file, NEURARCH_API
    ...trace, write the graph, print "wrote ..." on stderr...
    return run_plan(args, graph, path, target=..., inputs=..., base=base)

and ``neurarch-trace plan FILE.neurarch.json [--share] [--base FILE] [--fail-on-block]`` re-plans a
saved graph without tracing (:func:`add_replan_arguments`, :func:`plan_command`; ``cli.py`` parses
and guards it like every subcommand).

Streams: stdout carries only the card, verbatim, and, when shared, a last line ``Share: <url>``.
stderr carries the notice naming the host and what is sent, and every ``neurarch-trace: ...`` line.

Exit codes of :func:`run_plan` and :func:`plan_command`: 0 once the card printed (also when a share was
asked and no link came back: one stderr line says why); 1 for a plan failure (connection, timeout,
non-2xx, malformed answer; the line says the graph is still on disk at its path) or a bad graph
file; 2 with ``--fail-on-block`` when the plan reports a blocker.

Privacy: nothing is sent unless ``--plan`` or ``--share`` was given (``plan`` implies ``--plan``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from typing import Optional

from neurarch_trace.console import say, write_stdout
from neurarch_trace.contract import read_graph
from neurarch_trace.errors import NeurarchError
from neurarch_trace.plan_client import PlanResponse, api_host, request_plan, trace_source, user_agent
from neurarch_trace.plan_options import (
    PLAN_OPTIONS,
    REPLAN_SHARE,
    SHARE,
    PlanChoices,
    add_options,
    block_verdict,
    consent_notice,
)
from neurarch_trace.text import printable

__all__ = ["add_plan_arguments", "add_replan_arguments", "check_plan_arguments", "plan_command", "run_plan",
           "wants_plan"]


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the plan options (:data:`~neurarch_trace.plan_options.PLAN_OPTIONS`: ``--plan``,
    ``--share``, ``--base FILE``, ``--fail-on-block``, ``--seq-len N``, ``--attention KIND``) to the
    trace parser, in a group of their own.

    Destinations: ``args.plan``, ``args.share`` (bools), ``args.base`` (path or None),
    ``args.fail_on_block`` (bool), ``args.seq_len`` (int or None), ``args.attention`` (str or None).
    """
    group = parser.add_argument_group(
        "plan", "send the traced graph to a plan service (NEURARCH_API, default www.neurarch.com)"
    )
    add_options(group.add_argument, PLAN_OPTIONS)


def add_replan_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``neurarch-trace plan``: the graph file, every plan option but ``--plan``
    (implied), and ``--verbose``."""
    parser.add_argument("graph", metavar="FILE.neurarch.json", help="the graph to plan")
    add_options(parser.add_argument, [REPLAN_SHARE if option is SHARE else option for option in PLAN_OPTIONS[1:]])
    parser.add_argument(
        "--verbose", action="store_true", help="on failure, also print the underlying error chain"
    )


def wants_plan(args: argparse.Namespace) -> bool:
    """True when the user asked for anything to be sent (``--plan`` or ``--share``)."""
    return PlanChoices.from_args(args).sends


def check_plan_arguments(args: argparse.Namespace) -> Optional[dict]:
    """Validate the plan flags before any tracing; return the loaded ``--base`` graph or None.

    Reads the plan options and ``args.output`` (the ``-o`` value; ``"-"`` means stdout).

    Raises:
        NeurarchError: one line, when ``-o -`` is combined with ``--plan``/``--share`` (stdout is
            the card's), when ``--base``, ``--seq-len``, ``--attention`` or ``--fail-on-block`` comes
            without ``--plan``/``--share``, when ``NEURARCH_API`` is not an http(s) URL
            (:class:`~neurarch_trace.plan_client.PlanError`), or when the ``--base`` file is
            missing, not JSON or not a graph (:class:`~neurarch_trace.errors.GraphError`).
    """
    choices = PlanChoices.from_args(args)
    choices.check_flags()
    if not choices.sends:
        return None
    if getattr(args, "output", None) == "-":
        raise NeurarchError(
            f"-o - cannot be combined with {choices.flag}: stdout carries the card; "
            "write the graph to a file with -o FILE"
        )
    return choices.prepare()


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
    choices = PlanChoices.from_args(args)
    if not choices.sends:
        return 0
    return _plan_and_print(graph, graph_path, choices, base=base, source=trace_source(target, list(inputs)),
                           verbose=bool(getattr(args, "verbose", False)))


def plan_command(args: argparse.Namespace) -> int:
    """``neurarch-trace plan FILE [--share] [--base FILE] [--fail-on-block] [--seq-len N]
    [--attention KIND] [--verbose]``: re-plan a saved graph. The graph and the ``--base`` file are
    read and checked before anything is sent. Returns the exit code as :func:`run_plan`; raises
    :class:`~neurarch_trace.errors.NeurarchError` for a bad graph or base file."""
    graph = read_graph(args.graph)
    choices = dataclasses.replace(PlanChoices.from_args(args), plan=True)  # the command is the request
    base = choices.prepare()
    # The card is headed by source.target: the file's name, not its folders (they stay private).
    source = {"kind": "file", "target": os.path.basename(args.graph), "tool": user_agent()}
    return _plan_and_print(graph, args.graph, choices, base=base, source=source, verbose=args.verbose)


def _plan_and_print(graph: dict, graph_path: Optional[str], choices: PlanChoices, *, base: Optional[dict],
                    source: dict, verbose: bool) -> int:
    share = choices.share
    print(consent_notice(graph, base, share=share, host=api_host()), file=sys.stderr, flush=True)
    try:
        answer = request_plan(graph, base=base, source=source, **choices.request_options())
    except NeurarchError as err:
        if verbose:
            traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
        still = f"; the graph is still at {graph_path}" if graph_path else ""
        say(f"{err}{still}")
        return 1
    _print_card(answer, share)
    for line in choices.ignored(answer.plan):
        say(f"note: {line}")
    if share and answer.url is None:
        say(f"no share link: {answer.share_error}")
    return _verdict(answer) if choices.fail_on_block else 0


def _verdict(answer: PlanResponse) -> int:
    """The exit code of ``--fail-on-block``: 2 when blocked, 1 when the plan cannot tell, else 0."""
    verdict = block_verdict(answer.blocked, answer.blockers)
    if verdict is None:
        return 0
    if answer.blocked is None:
        say(verdict)
        return 1
    say(f"{verdict}; exit 2 (--fail-on-block)")
    return 2


def _print_card(answer: PlanResponse, share: bool) -> None:
    # the card as the service rendered it, less control characters a service could use to drive
    # the terminal (escape sequences); newlines stay
    text = printable(answer.text, keep_newlines=True)
    text = text if text.endswith("\n") or not text else text + "\n"
    if share and answer.url is not None:
        text += f"Share: {answer.url}\n"
    write_stdout(text, "the card")
