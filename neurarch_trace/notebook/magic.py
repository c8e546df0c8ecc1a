"""``%neurarch``: trace a model from the notebook's namespace, write its graph, and plan it on request.

    %load_ext neurarch_trace
    %neurarch model --input 1,3,224,224 --plan --share
    r = %neurarch model --input batch                 # a tensor, tuple/list or dict in the namespace

The magic is thin: IPython's magic-argument machinery parses the line (so ``%neurarch?`` shows the
options), names are looked up in the user's namespace, and the work is done by the same tracer
(:func:`neurarch_trace.tracer.trace_model`), graph writer and plan client as the command line. Every
user error is a ``UsageError``, which IPython shows as one line; ``--verbose`` also prints the
traceback. A plan failure is not an error of the magic: the graph is still written and the returned
:class:`~neurarch_trace.notebook.result.NeurarchResult` carries the failure in ``error``.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from neurarch_trace.contract import check_output_path, default_graph_path
from neurarch_trace.errors import NeurarchError
from neurarch_trace.notebook.namespace import evaluate, resolve_inputs
from neurarch_trace.plan_options import NOTEBOOK_PLAN_OPTIONS, PlanChoices, add_options
from neurarch_trace.text import error_line

__all__ = ["NeurarchMagics", "load_ipython_extension", "unload_ipython_extension", "resolve_inputs"]

_NO_SAVE = ("", "''", '""')


def _plan_arguments(func: Callable) -> Callable:
    """Decorate the magic with the plan options (:mod:`neurarch_trace.plan_options`)."""
    for decorator in reversed(add_options(argument, NOTEBOOK_PLAN_OPTIONS)):
        func = decorator(func)
    return func


# ------------------------------------------------------------------------------------ magic


@magics_class
class NeurarchMagics(Magics):
    """The ``%neurarch`` line magic."""

    @needs_local_scope
    @magic_arguments()
    @argument(
        "expr", nargs="+",
        help="the model: an nn.Module instance in the notebook (the usual case), a Module class "
             "(built with no arguments) or a factory (called with no arguments); any Python expression",
    )
    @argument(
        "-i", "--input", action="append", default=[], metavar="[NAME=]DIMS[:dtype] | [NAME=]VAR",
        help="one per forward argument, batch first: a shape such as 1,3,224,224 or 1,16:long (a seeded "
             "random tensor), or the name of a tensor, a tuple/list of tensors (positional) or a dict of "
             "tensors (keyword arguments) in the notebook; NAME= passes it as that keyword argument",
    )
    @argument("--dtype", default=None, help="dtype of shape inputs without a suffix (default float32)")
    @_plan_arguments
    @argument("--name", default=None, help="the graph's name (default: the class or factory name)")
    @argument("--depth", type=int, default=None, metavar="N",
              help="stop descending at depth N (1 = the model's children); a container cut off there is one node")
    @argument("-o", "--output", default=None, metavar="PATH",
              help="where to write the graph (default ./<name>.neurarch.json)")
    @argument("--no-save", action="store_true", help="do not write the graph file")
    @argument("--verbose", action="store_true", help="show the full traceback of a failure")
    @line_magic
    def neurarch(self, line: str = "", local_ns: Optional[dict] = None) -> Any:
        """Trace one forward pass of a PyTorch model into a .neurarch.json graph, in the notebook.

        Returns a NeurarchResult (graph, path, card, url, plan, error) whose display is a widget:
        summary, per-layer table and a button to get the plan; with --plan/--share, the card and the
        share link. Example::

            %neurarch model --input 1,3,224,224 --plan --share
            r = %neurarch model --input batch
        """
        args = parse_argstring(self.neurarch, line)
        verbose = bool(args.verbose)
        try:
            return self._run(args, local_ns)
        except UsageError:
            raise
        except NeurarchError as exc:
            if verbose:
                traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            raise UsageError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a fault of ours: one line, traceback with --verbose
            if verbose:
                traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            raise UsageError(
                f"internal error: {error_line(exc)} (run again with --verbose and report it)"
            ) from None

    def _run(self, args: Any, local_ns: Optional[dict]) -> Any:
        """Check the line, trace, write the graph, and plan it when asked (see :meth:`neurarch`)."""
        choices = PlanChoices.from_args(args)
        if args.depth is not None and args.depth < 0:
            raise UsageError(f"--depth must be 0 or more, not {args.depth}")
        choices.check_flags()
        no_save, path = _output(args)
        if not args.input:
            raise UsageError(
                "no --input given: pass one per forward argument, batch first, e.g. --input 1,3,224,224, "
                "or the name of a tensor in the notebook, e.g. --input batch"
            )
        if path is not None:
            check_output_path(path)
        base = choices.prepare()  # before any work, so a bad address or base file costs no trace

        expr = " ".join(args.expr).strip()
        graph, spec_texts = self._trace(expr, args, local_ns)
        if not no_save:
            from neurarch_trace.contract import write_error, write_graph

            path = path or default_graph_path(graph["name"])
            try:
                write_graph(graph, path)
            except OSError as exc:
                raise write_error(exc, path) from None

        from neurarch_trace.notebook.result import NeurarchResult
        from neurarch_trace.plan_client import trace_source

        result = NeurarchResult(graph, path=path, source=trace_source(expr, spec_texts), base=base,
                                verbose=bool(args.verbose))
        if choices.sends:
            _plan(result, choices.share)
        return result

    def _trace(self, expr: str, args: Any, local_ns: Optional[dict]) -> tuple:
        """The graph of the model ``expr`` names, on the ``--input`` values; and the inputs written
        back as shape specs (for the plan request's ``source``)."""
        import torch

        from neurarch_trace.inputs import parse_dtype
        from neurarch_trace.targets import as_module
        from neurarch_trace.tracer import trace_model

        namespace = dict(self.shell.user_ns)
        if local_ns:
            namespace.update(local_ns)
        global_ns = self.shell.user_global_ns
        default_dtype = parse_dtype(args.dtype) if args.dtype else torch.float32

        target = evaluate(expr, namespace, global_ns, "the model expression")
        model = as_module(target, label=expr)
        name = args.name
        if name is None and not isinstance(target, torch.nn.Module):
            name = getattr(target, "__name__", None)

        fwd_args, fwd_kwargs, spec_texts = resolve_inputs(
            list(args.input), namespace, model=model, default_dtype=default_dtype, global_ns=global_ns
        )
        try:
            graph = trace_model(model, tuple(fwd_args), kwargs=fwd_kwargs, name=name, depth=args.depth)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        return graph, spec_texts


def _output(args: Any) -> tuple:
    """``(no_save, path)`` from ``-o`` and ``--no-save``: an empty ``-o`` also means no file; the
    path is user-expanded. Raises ``UsageError`` for ``-o -`` or ``-o`` with ``--no-save``."""
    output = args.output
    no_save = bool(args.no_save) or (output is not None and output.strip() in _NO_SAVE)
    if args.no_save and output is not None and output.strip() not in _NO_SAVE:
        raise UsageError("-o and --no-save contradict each other: give one")
    if output is not None and output.strip() == "-":
        raise UsageError("-o - (stdout) has no meaning in a notebook: the result holds the graph; use --no-save")
    path = os.path.expanduser(output.strip()) if not no_save and output is not None else None
    return no_save, path


def _plan(result: Any, share: bool) -> None:
    """Plan ``result`` after saying what is sent; a failure is reported on stderr, not raised."""
    print(result.send_notice(share), flush=True)
    result.request_plan(share=share)
    if result.error:
        print(f"neurarch: plan failed: {result.error}", file=sys.stderr, flush=True)
        if result.traceback:
            print(result.traceback, file=sys.stderr, end="", flush=True)
    elif share and result.url is None and result.share_error:
        print(f"neurarch: no share link: {result.share_error}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------- extension


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext neurarch_trace``: register ``%neurarch``."""
    ipython.register_magics(NeurarchMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext neurarch_trace``: remove ``%neurarch``."""
    manager = ipython.magics_manager
    if manager.magics["line"].get("neurarch") is not None:
        owner = getattr(manager.magics["line"]["neurarch"], "__self__", None)
        if isinstance(owner, NeurarchMagics):
            del manager.magics["line"]["neurarch"]
    manager.registry.pop(NeurarchMagics.__name__, None)
