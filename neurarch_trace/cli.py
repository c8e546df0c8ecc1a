"""The ``neurarch-trace`` command line: a thin front end over the tracer, the plan client and the
reference plan service.

    neurarch-trace TARGET --input DIMS[:dtype] [...]   trace a model into a .neurarch.json graph
    neurarch-trace plan FILE.neurarch.json [...]        plan a saved graph
    neurarch-trace serve [...]                          run the reference plan service

One dispatcher (:func:`main`) picks the subcommand by the first word (anything else is a trace
target), parses with that subcommand's parser and runs it inside one error boundary
(:func:`_guarded`): every failure a user can cause prints one line ``neurarch-trace: ...`` on stderr
and exits 1 (a traceback only with ``--verbose``). ``serve`` is the plan service's own front end
(:mod:`neurarch_trace.server.cli`), handed the rest of the line.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import neurarch_trace.plan_cli as plan_cli
from neurarch_trace._version import __version__
from neurarch_trace.console import PROG, Parser, say, show_warning, stdout_to_stderr, write_stdout
from neurarch_trace.contract import (
    check_output_path,
    default_graph_path,
    dumps_graph,
    layer_count,
    named_graph_path,
    unwritable_folder,
    write_error,
    write_graph,
)
from neurarch_trace.errors import NeurarchError
from neurarch_trace.plan_options import add_options
from neurarch_trace.text import plural
from neurarch_trace.trace_options import TARGET, TRACE_OPTIONS, TraceChoices

__all__ = ["DEVICES", "build_parser", "build_plan_parser", "main", "run"]

#: The choices of ``--device`` (the same as :data:`neurarch_trace.api.DEVICES`, which needs torch).
DEVICES = ("auto", "cpu", "meta")


def build_parser() -> argparse.ArgumentParser:
    """The trace command's parser (the plan options included)."""
    parser = Parser(
        prog=PROG,
        description=(
            "Trace one forward pass of a PyTorch model into a .neurarch.json graph. "
            "Other commands: 'neurarch-trace plan FILE.neurarch.json' plans a saved graph; "
            "'neurarch-trace serve' runs the reference plan service."
        ),
        epilog=(
            "Targets: path/to/file.py:Attr, package.module:attr, hf:<repo-id or folder>. "
            "Attr may be an nn.Module instance, a Module class (built with no arguments) or a factory. "
            "Nothing leaves this machine unless --plan or --share is given."
        ),
    )
    parser.add_argument(TARGET.flags[0], **dict(TARGET.kwargs))
    add_options(parser.add_argument, TRACE_OPTIONS)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    plan_cli.add_plan_arguments(parser)
    return parser


def build_plan_parser() -> argparse.ArgumentParser:
    """The parser of ``neurarch-trace plan``."""
    parser = Parser(
        prog=f"{PROG} plan",
        description="Re-plan a saved .neurarch.json graph without tracing again: send it to the plan "
        "service (NEURARCH_API, default www.neurarch.com) and print the card it returns.",
        epilog="Exit codes: 0 card printed; 1 bad graph file or the plan failed (the graph file is "
        "untouched), or --fail-on-block and the plan carries no verdict; 2 with --fail-on-block when the plan "
        "reports a blocker.",
    )
    plan_cli.add_replan_arguments(parser)
    return parser


@dataclass(frozen=True)
class _Command:
    """A subcommand: its parser, what runs it (returns the exit code), and what to say when the
    user interrupts it."""

    parser: Callable[[], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], int]
    interrupted: str


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 success, 1 failure, 2 blocked plan)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["serve"]:
        from neurarch_trace.server.cli import serve_main

        return serve_main(args_list[1:])
    if args_list[:1] == ["plan"]:
        command, rest = _COMMANDS["plan"], args_list[1:]
    else:
        command, rest = _COMMANDS["trace"], args_list
    if command is _COMMANDS["plan"]:  # its imports are this module's
        _imports_done()
    try:
        args = command.parser().parse_args(rest)
    except SystemExit as exc:  # --help, --version, or a usage error already printed as one line
        return int(exc.code or 0)
    return _guarded(command, args)


#: Set by :func:`run`: this process runs one command and exits.
_PROCESS_OWNED = False


def _imports_done() -> None:
    """In a process of its own (:func:`run`): freeze what the imports made out of garbage
    collection and turn the collector back on. Elsewhere (tests, a notebook) nothing changes."""
    if _PROCESS_OWNED:
        gc.freeze()
        gc.enable()


def run() -> None:
    """The console script and ``python -m neurarch_trace``: :func:`main`, then a quick exit.

    A trace or a plan leaves nothing to clean up once its output is flushed (files are written and
    closed before ``main`` returns), so the process runs the ``atexit`` handlers (a model file's
    own included) and ends with ``os._exit``: the interpreter's teardown of everything torch loaded
    takes about 0.4 s, a fifth of a cold start. ``serve`` exits the ordinary way (its workers shut
    down on their own terms).

    The process is the command's alone, so the garbage collector is off while the imports run
    (``import torch`` makes 170,000 objects, none of them garbage; the collections they set off
    cost 0.08 s of a 1.8 s ResNet-50 cold start, measured here with 8 alternating runs), and what
    they made is then frozen out of collection (:func:`_imports_done`): it lives until the exit,
    and a full collection walking it cost 80 ms of a ResNet-50 trace.
    """
    global _PROCESS_OWNED
    _PROCESS_OWNED = True
    if sys.argv[1:2] != ["serve"]:  # a service runs for long, its collector as usual
        gc.disable()
    code = main()
    if sys.argv[1:2] == ["serve"]:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: started with the stream closed (>&-)
                stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): nothing more can be said
            pass
    with stdout_to_stderr():  # a model file's atexit handlers print after the graph or the card
        atexit._run_exitfuncs()
    os._exit(code)


def _guarded(command: _Command, args: argparse.Namespace) -> int:
    """The one error boundary: a user's error is one line and exit 1; so is a fault of ours, with
    the traceback under ``--verbose``."""
    verbose = bool(getattr(args, "verbose", False))
    try:
        return command.run(args)
    except NeurarchError as exc:
        if verbose:
            traceback.print_exc()
        say(str(exc))
        return 1
    except KeyboardInterrupt:
        say(command.interrupted)
        return 1
    except Exception as exc:  # noqa: BLE001 - a fault of ours: one line, traceback with --verbose
        if verbose:
            traceback.print_exc()
        say(f"internal error: {type(exc).__name__}: {exc} (run again with --verbose and report it)")
        return 1


def _trace_command(args: argparse.Namespace) -> int:
    """The trace command: check everything that can be checked before the trace, trace, write the
    graph (or print it with ``-o -``), then plan it when asked. Torch loads here, not before."""
    from neurarch_trace.api import trace_target
    from neurarch_trace.inputs import parse_dtype, parse_input
    from neurarch_trace.progress import Progress
    from neurarch_trace.targets import check_target_form

    _imports_done()
    check_target_form(args.target)
    trace = TraceChoices.from_args(args)
    to_stdout = args.output == "-"
    base = plan_cli.check_plan_arguments(args)
    trace.check()  # --depth, --weights and --hf-class on hf: only, --weights with --device meta
    input_texts = trace.input_texts()
    specs = [parse_input(text) for text in input_texts]
    default_dtype = parse_dtype(trace.dtype_name())
    device = trace.build_device()
    if args.output is not None and not args.output.strip():
        raise NeurarchError("-o needs a file name, e.g. -o model.neurarch.json (or -o - for stdout)")
    out_path = check_output_path(args.output) if not to_stdout and args.output is not None else None
    if args.output is None and args.name:  # ./<name>.neurarch.json, known before the trace
        check_output_path(named_graph_path(args.name))
    elif args.output is None:  # the graph goes to ./<name>.neurarch.json: a folder that takes no file costs no trace
        reason = unwritable_folder(os.getcwd())
        if reason is not None:
            raise NeurarchError(f"cannot write the graph in the current folder {os.getcwd()}: {reason}; "
                                f"give -o PATH elsewhere (or -o - for stdout)")

    progress = Progress()
    notes: list = []
    # stdout carries the graph (-o -) or the card alone: what the model's code prints while it is
    # imported, built, traced and rehearsed goes to stderr
    with progress, warnings.catch_warnings(), stdout_to_stderr():
        warnings.showwarning = show_warning  # the model's warnings, one line each (trace.notices)
        graph, loaded_name = trace_target(
            args.target,
            specs,
            default_dtype=default_dtype,
            name=args.name,
            depth=args.depth,
            device=device,
            weights=args.weights,
            hf_class=trace.hf_class_name,
            quiet=not args.verbose,
            progress=progress,
            note=notes.append,
            training_step=trace.training_step,
            finetune=trace.finetune,
        )
    for line in notes:
        say(f"note: {line}")
    training = graph.get("measured", {}).get("training")
    if isinstance(training, dict) and training.get("error"):  # the trace stands; the plan estimates memory
        say(f"note: memory will be estimated from layer outputs: {training['error']}")
    if to_stdout:
        write_stdout(dumps_graph(graph), "the graph", fix="; give -o PATH to write a file")
        path = None
    else:
        path = out_path or default_graph_path(graph["name"])
        progress.step("writing the graph")
        try:
            write_graph(graph, path)
        except OSError as exc:
            raise write_error(exc, path) from exc
        progress.clear()
        counts = f"{plural(layer_count(graph), 'layer')}, {plural(len(graph['connections']), 'connection')}"
        print(f"wrote {path} ({counts})", file=sys.stderr, flush=True)
    try:
        return plan_cli.run_plan(args, graph, path, target=args.target, inputs=input_texts, base=base)
    except KeyboardInterrupt:  # the graph is written: say where, as a failed plan does
        where = f"the graph is still at {path}" if path is not None else "the graph went to stdout"
        raise NeurarchError(f"interrupted while planning; {where}") from None


_COMMANDS = {
    "trace": _Command(build_parser, _trace_command, "interrupted; nothing was written"),
    "plan": _Command(build_plan_parser, plan_cli.plan_command, "interrupted"),
}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
