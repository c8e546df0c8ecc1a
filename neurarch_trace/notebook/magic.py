"""``%neurarch``: trace a model, write its graph, and plan it on request; in the notebook, with the
command line's language.

    %load_ext neurarch_trace
    %neurarch model --input 1,3,224,224 --plan --share   # a model in the notebook
    %neurarch hf:./my-checkpoint --plan                   # a target, as the command line takes it
    r = %neurarch model --input batch                     # a tensor, tuple/list or dict in the notebook

The magic is thin: IPython's magic-argument machinery parses the line, with the command line's trace
and plan options built from the same definitions (:mod:`neurarch_trace.trace_options`,
:mod:`neurarch_trace.plan_options`), so ``%neurarch?`` shows them and the names, defaults, choices
and checks are the command line's. The model is a Python expression in the notebook or a target the
command line takes (:func:`~neurarch_trace.notebook.namespace.model_kind` states the rule); the work
is done by the same loader (:func:`neurarch_trace.api.trace_target`), tracer, graph writer and plan
client as the command line. Every user error is a ``UsageError``, which IPython shows as one line;
``--verbose`` also prints the traceback. A plan failure is not an error of the magic (but with
``--fail-on-block``): the graph is still written and the returned
:class:`~neurarch_trace.notebook.result.NeurarchResult` carries the failure in ``error``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments

from neurarch_trace.contract import check_output_path, default_graph_path, named_graph_path, unwritable_folder
from neurarch_trace.errors import NeurarchError
from neurarch_trace.notebook.namespace import _model_device, evaluate, is_shape_spec, model_kind, resolve_inputs
from neurarch_trace.plan_options import FAIL_ON_BLOCK, PLAN_OPTIONS, Option, PlanChoices, add_options, block_verdict
from neurarch_trace.text import error_line
from neurarch_trace.trace_options import (
    DEVICE,
    INPUT,
    OUTPUT,
    TARGET_FORMS,
    TRACE_OPTIONS,
    TraceChoices,
    explain_parse_error,
)

__all__ = ["MAGIC_ONLY", "MAGIC_PLAN_OPTIONS", "MAGIC_TRACE_OPTIONS", "NeurarchMagics", "load_ipython_extension",
           "resolve_inputs", "unload_ipython_extension"]

_NO_SAVE = ("", "''", '""')


def split_line(line: str) -> list[str]:
    """The magic's line as argv: the target as written (Python keeps its own quotes and spaces,
    ``zoo["my model"]``), then the options split as a POSIX shell splits them (``-o "My
    Drive/g.json"``, ``--name="My model"``, ``--name My\\ model``; on Windows a backslash is a path
    separator, not an escape). The options start at the first ``-`` that begins a word outside
    brackets and quotes and is not a negative number (in a target whose bracket or quote is left
    open, the first such ``-``). IPython's own split keeps the quotes
    (``arg_split`` is not POSIX), which would put them in a file name.

    Raises:
        UsageError: a quote is not closed.
    """
    depth, quote, start = 0, "", len(line)
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch == "-" and depth == 0 and (i == 0 or line[i - 1].isspace()) and \
                line[i + 1:i + 2] not in ("", " ", "\t") and not line[i + 1:i + 2].isdigit():
            start = i
            break
    if start == len(line) and (depth or quote):  # a target with an open bracket or quote: not Python
        found = re.search(r"(?:^|\s)(-[^\s\d])", line)
        start = found.start(1) if found else start
    lexer = shlex.shlex(line[start:], posix=True)
    lexer.whitespace_split = True
    if os.name == "nt":
        lexer.escape = ""
    try:
        options = list(lexer)
    except ValueError as exc:
        raise UsageError(f"cannot read the line: {str(exc).lower()} (close the quote, or escape it)") from None
    target = line[:start].strip()
    return ([target] if target else []) + options

# What the magic's help says differently from the command line's, by flags (same flags, defaults,
# choices and checks).
_NOTEBOOK_WORDS = {
    INPUT.flags: {
        "metavar": "[NAME=]DIMS[:dtype] | [NAME=]VAR",
        "help": "one per forward argument, batch first: a shape such as 1,3,224,224 or 1,16:long (a seeded random "
                "tensor), or the name of a tensor, a tuple/list of tensors (positional) or a dict of tensors "
                "(keyword arguments) in the notebook; NAME= passes it as that keyword argument; hf: targets "
                "default to 1,16",
    },
    OUTPUT.flags: {"help": "where to write the graph (default ./<name>.neurarch.json; -o '' or --no-save: none)"},
    DEVICE.flags: {"help": DEVICE.kwargs["help"] + "; a live model in the notebook is never moved: --device must "
                   "name where it lives"},
    FAIL_ON_BLOCK.flags: {"help": "raise after showing the result when the plan reports a blocker (the graph "
                          "would not run), so Run All stops there"},
}


def _in_notebook_words(options: Sequence[Option]) -> tuple:
    """``options`` with the magic's help words (:data:`_NOTEBOOK_WORDS`) where it has its own."""
    return tuple(dataclasses.replace(o, kwargs={**o.kwargs, **_NOTEBOOK_WORDS[o.flags]})
                 if o.flags in _NOTEBOOK_WORDS else o for o in options)


#: The magic's trace and plan options: the command line's (:data:`~neurarch_trace.trace_options.TRACE_OPTIONS`,
#: :data:`~neurarch_trace.plan_options.PLAN_OPTIONS`) with the same flags, defaults, choices and
#: checks; ``--input`` also names notebook data, ``-o -`` (stdout) is refused.
MAGIC_TRACE_OPTIONS = _in_notebook_words(TRACE_OPTIONS)
MAGIC_PLAN_OPTIONS = _in_notebook_words(PLAN_OPTIONS)
NO_SAVE = Option(("--no-save",), {"action": "store_true", "help": "do not write the graph file"})
#: The magic's options the command line does not have.
MAGIC_ONLY: tuple = (NO_SAVE,)
_NO_INPUT_EXAMPLE = ", or the name of a tensor in the notebook, e.g. --input batch"


def _options(*groups: Sequence[Option]) -> Callable:
    """Decorate the magic with these options, in this order (a decorator per option)."""
    def decorate(func: Callable) -> Callable:
        for group in reversed(groups):
            for decorator in reversed(add_options(argument, group)):
                func = decorator(func)
        return func
    return decorate


# ------------------------------------------------------------------------------------ magic


@magics_class
class NeurarchMagics(Magics):
    """The ``%neurarch`` line magic."""

    @needs_local_scope
    @magic_arguments()
    @argument(
        "target", nargs="+", metavar="TARGET",
        help="the model: a Python expression in the notebook (an nn.Module instance, a Module class built "
             f"with no arguments, or a factory called with none), or a target as on the command line: {TARGET_FORMS}",
    )
    @_options(MAGIC_TRACE_OPTIONS, MAGIC_PLAN_OPTIONS, MAGIC_ONLY)
    @line_magic
    def neurarch(self, line: str = "", local_ns: Optional[dict] = None) -> Any:
        """Trace one forward pass of a PyTorch model into a .neurarch.json graph, in the notebook.

        TARGET is a model in the notebook or anything the command line takes::

            %neurarch model --input 1,3,224,224        a Python expression: an nn.Module, a class, a factory
            %neurarch hf:bert-base-uncased --plan      hf:<repo-id or folder>, built from its config on meta
            %neurarch models/resnet.py:ResNet18 -i 1,3,224,224     a file and an attribute in it
            %neurarch mypkg.models:build -i 1,3,224,224            a module and an attribute in it
            r = %neurarch model --input batch          data in the notebook as the inputs

        Which one: valid Python is an expression, evaluated in the notebook; anything else of a
        target's form is loaded as the command line loads it. No target form is valid Python (a
        colon outside brackets is not), so `resnet` is always the notebook's variable and
        `resnet:ResNet18` always the module's attribute, whatever the notebook holds.

        The options are the command line's, with the same names, defaults and errors; besides,
        --input also names data in the notebook, and --no-save writes no file; -o - (stdout) and
        --version are the command line's only. A live model is never moved: --device must name
        where it lives (a class, a factory or a target is built on --device). The plan options
        without --plan/--share are kept for the widget's plan button and r.request_plan()
        (nothing is sent without --plan, --share or a click); --fail-on-block raises after showing
        the result when the plan reports a blocker, so "Run All" stops there.

        Returns a NeurarchResult (graph, path, card, url, plan, error) whose display is a widget:
        summary, per-layer table and a button to get the plan; with --plan/--share, the card and the
        share link.
        """
        words = split_line(line)
        if "-h" in words or "--help" in words:  # as the command line's: the options, and nothing traced
            # IPython formats it for its docstrings (an reST literal block): shown as a usage text
            print("usage: " + self.neurarch.parser.format_help().removeprefix("::").lstrip())
            return None
        try:
            args = self.neurarch.parser.parse_args(words)
        except UsageError as exc:
            raise UsageError(explain_parse_error(str(exc))) from None
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
        text = " ".join(args.target).strip()
        kind = model_kind(text)
        if kind == "target":
            from neurarch_trace.targets import check_target_form

            check_target_form(text)
        trace = TraceChoices.from_args(args, target=text)
        choices = PlanChoices.from_args(args)
        trace.check()
        choices.check_flags(later=True)
        no_save, path = _output(args)
        input_texts = trace.input_texts(example=_NO_INPUT_EXAMPLE)
        _check_specs(trace, input_texts)
        if path is None and not no_save and trace.name:  # ./<name>.neurarch.json, known before the trace
            path = named_graph_path(trace.name)
        if path is not None:
            check_output_path(path)
        elif not no_save and (reason := unwritable_folder(os.getcwd())) is not None:
            raise NeurarchError(f"cannot save the graph in the current folder {os.getcwd()}: {reason}; "
                                "give -o PATH elsewhere, or --no-save")
        base = choices.prepare(later=True)  # before any work, so a bad address or base file costs no trace

        namespace = dict(self.shell.user_ns)
        if local_ns:
            namespace.update(local_ns)
        scope = _Scope(namespace, self.shell.user_global_ns, input_texts)
        graph, source = _trace_target(text, trace, scope) if kind == "target" else _trace_expression(text, trace, scope)
        if not no_save:
            from neurarch_trace.contract import write_error, write_graph

            path = path or default_graph_path(graph["name"])
            try:
                write_graph(graph, path)
            except OSError as exc:
                raise write_error(exc, path) from None

        from neurarch_trace.notebook.result import NeurarchResult

        result = NeurarchResult(graph, path=path, source=source, base=base, plan_options=choices.sizing(),
                                verbose=trace.verbose)
        if choices.sends:
            _plan(result, choices.share, fail_on_block=choices.fail_on_block)
        return result


def _check_specs(trace: TraceChoices, texts: Sequence[str]) -> None:
    """Parse ``--dtype`` and the shape inputs before anything is built, as the command line does."""
    from neurarch_trace.inputs import parse_dtype, parse_input

    for text in texts:
        if is_shape_spec(text):
            parse_input(text)
    parse_dtype(trace.dtype_name())


@dataclasses.dataclass(frozen=True)
class _Scope:
    """Where the line's names are looked up, and its ``--input`` values."""

    namespace: dict
    global_ns: dict
    inputs: list


def _trace_target(text: str, trace: TraceChoices, scope: _Scope) -> tuple:
    """``(graph, source)`` of a target, built as the command line builds it (on ``--device``;
    ``hf:`` on meta by default). Shape inputs go through :func:`~neurarch_trace.api.trace_target`,
    the command line's own path; notebook data is moved to the model's device."""
    from neurarch_trace.api import trace_target
    from neurarch_trace.inputs import parse_dtype, parse_input
    from neurarch_trace.plan_client import trace_source
    from neurarch_trace.targets import load_target

    device = trace.build_device()
    if all(is_shape_spec(t) for t in scope.inputs):
        specs = [parse_input(t) for t in scope.inputs]
        graph, _ = trace_target(
            text, specs, default_dtype=parse_dtype(trace.dtype_name()), name=trace.name, depth=trace.depth,
            device=device, weights=trace.weights, hf_class=trace.hf_class_name, quiet=not trace.verbose,
            training_step=trace.training_step, finetune=trace.finetune, note=_say_note)
        return graph, trace_source(text, list(scope.inputs))
    device = "cpu" if device == "auto" else device  # notebook data holds real values: a real model
    loaded = load_target(text, device=device, weights=trace.weights, hf_class=trace.hf_class_name,
                         quiet=not trace.verbose)
    return _trace_model(loaded.model, text, trace, scope, name=trace.name or loaded.name, device=device,
                        described=True)


def _say_note(line: str) -> None:
    """A note of ``--device auto`` (it traced elsewhere than it first tried), on the cell's stderr."""
    print(f"neurarch: note: {line}", file=sys.stderr, flush=True)


def _trace_expression(text: str, trace: TraceChoices, scope: _Scope) -> tuple:
    """``(graph, source)`` of the model a Python expression names: a live ``nn.Module`` as it is
    (never moved), a class or factory built on ``--device``."""
    import torch

    from neurarch_trace.targets import as_module

    found = evaluate(text, scope.namespace, scope.global_ns, "the model expression")
    if isinstance(found, torch.nn.Module):
        _check_live_device(found, trace.device, text)
        return _trace_model(found, text, trace, scope, name=trace.name, device=None)
    device = trace.build_device()
    if device == "auto":  # a class or factory of the notebook's: built on the CPU, as the notebook would
        device = "cpu"
    if device == "cpu":
        model = as_module(found, label=text)
    else:
        with torch.device(device):
            model = as_module(found, label=text)
    name = trace.name or getattr(found, "__name__", None)
    return _trace_model(model, text, trace, scope, name=name, device=device)


def _check_live_device(model: Any, device: Optional[str], text: str) -> None:
    """Refuse a ``--device`` other than where a live model lives: the magic never moves it."""
    if device is None:
        return
    where = _model_device(model)
    where = getattr(where, "type", where)
    if where != device:
        raise UsageError(
            f"--device {device}: {text} is a live model on {where}, and a live model is never moved; drop --device "
            f"(inputs are made where the model lives), or pass its class, a factory or a target, built on --device"
        )


def _trace_model(model: Any, text: str, trace: TraceChoices, scope: _Scope, *, name: Optional[str],
                 device: Optional[str], described: bool = False) -> tuple:
    """``(graph, source)``: ``model`` traced on the ``--input`` values (shapes or notebook data);
    notebook tensors are moved to ``device`` when it is the meta device (the model was built there).
    ``described``: the graph's description names the target, as the command line's does."""
    from neurarch_trace.inputs import parse_dtype
    from neurarch_trace.plan_client import trace_source
    from neurarch_trace.tracer import trace_model

    fwd_args, fwd_kwargs, spec_texts = resolve_inputs(
        list(scope.inputs), scope.namespace, model=model, default_dtype=parse_dtype(trace.dtype_name()),
        global_ns=scope.global_ns,
    )
    if device == "meta":
        fwd_args, fwd_kwargs = _to_device(fwd_args, device), _to_device(fwd_kwargs, device)
    description = None
    if described:
        description = f"Traced by neurarch-trace from {text} with " + " ".join(f"--input {t}" for t in spec_texts)
    graph = _guard(lambda: trace_model(model, tuple(fwd_args), kwargs=fwd_kwargs, name=name, depth=trace.depth,
                                       description=description, training_step=trace.training_step,
                                       finetune=trace.finetune))
    return graph, trace_source(text, spec_texts)


def _guard(run: Callable[[], Any]) -> Any:
    """Run a trace on notebook data; the tracer's ``ValueError``/``TypeError`` about its arguments
    (a 0-d tensor, ...) is a usage error."""
    try:
        return run()
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None


def _to_device(value: Any, device: str) -> Any:
    """``value`` with every tensor in it (in tuples, lists and dicts too) moved to ``device``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


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


def _plan(result: Any, share: bool, *, fail_on_block: bool = False) -> None:
    """Plan ``result`` after saying what is sent; a failure is reported on stderr, not raised, but
    with ``fail_on_block``: then a failure, a blocker or a plan without a verdict raises (after
    the result is shown, for a blocker)."""
    print(result.send_notice(share), flush=True)
    result.request_plan(share=share)
    if result.error:
        if fail_on_block:
            raise UsageError(f"plan failed: {result.error} (--fail-on-block)")
        print(f"neurarch: plan failed: {result.error}", file=sys.stderr, flush=True)
        if result.traceback:
            print(result.traceback, file=sys.stderr, end="", flush=True)
    elif share and result.url is None and result.share_error:
        print(f"neurarch: no share link: {result.share_error}", file=sys.stderr, flush=True)
    verdict = block_verdict(result.blocked, result.blockers) if fail_on_block and not result.error else None
    if verdict is not None:
        from IPython.display import display

        display(result)
        raise UsageError(f"{verdict} (--fail-on-block)")


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
