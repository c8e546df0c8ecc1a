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
import re
import sys
import traceback
from typing import Any, Mapping, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from neurarch_trace.errors import NeurarchError

__all__ = ["NeurarchMagics", "load_ipython_extension", "unload_ipython_extension", "resolve_inputs"]

_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(?!=)(.*)$", re.S)
_NO_SAVE = ("", "''", '""')


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _InputError(NeurarchError):
    """An ``--input`` that names nothing usable in the namespace."""


# ----------------------------------------------------------------------------------- inputs


def _tensor_spec_text(name: Optional[str], tensor: Any) -> str:
    """A tensor written back as an ``--input`` spec (``attention_mask=1,16:int64``), for ``source``."""
    from neurarch_trace.tracer import dtype_name

    dims = ",".join(str(int(d)) for d in tensor.shape) or "1"
    prefix = f"{name}=" if name else ""
    return f"{prefix}{dims}:{dtype_name(tensor.dtype)}"


def _evaluate(text: str, namespace: Mapping[str, Any], global_ns: Mapping[str, Any], what: str) -> Any:
    try:
        code = compile(text, f"<{what}>", "eval")
    except SyntaxError as exc:
        raise _InputError(f"{what} {text!r} is not a Python expression ({exc.msg})") from exc
    try:
        return eval(code, dict(global_ns), dict(namespace))  # noqa: S307 - the user's own notebook
    except NameError as exc:
        missing = getattr(exc, "name", None) or text
        raise _InputError(f"{what} {text!r}: no variable named {missing!r} in the notebook; run the cell that defines it first") from exc
    except Exception as exc:  # noqa: BLE001 - the user's own code can raise anything
        raise _InputError(f"{what} {text!r} failed: {_one_line(exc)}") from exc


def resolve_inputs(
    texts: list[str],
    namespace: Mapping[str, Any],
    *,
    model: Any = None,
    default_dtype: Any = None,
    global_ns: Optional[Mapping[str, Any]] = None,
) -> tuple[list[Any], dict[str, Any], list[str]]:
    """Turn the ``--input`` values into forward arguments: ``(args, kwargs, spec_texts)``.

    Each value is either a shape spec ``[NAME=]D0,D1,...[:dtype]`` (batch first; a seeded random
    tensor, as on the command line) or ``[NAME=]EXPR`` evaluated in ``namespace``: a tensor is the
    next positional argument, a tuple or list spreads into positional arguments, a dict (or a
    tokenizer's ``BatchEncoding``) gives keyword arguments; with ``NAME=`` the value is passed as
    that keyword argument whatever it holds. ``spec_texts`` writes each input back as a shape spec,
    for the plan request's ``source``.

    Raises:
        InputSpecError: a malformed shape spec.
        NeurarchError: a name not in the namespace, a value that is not a tensor, a tuple/list of
            tensors or a dict of tensors, a positional input after a keyword one, a keyword given twice.
    """
    import torch

    from neurarch_trace.inputs import make_inputs, parse_input

    global_ns = namespace if global_ns is None else global_ns
    entries: list[tuple[str, Any, Optional[str], str]] = []  # (kind, payload, kw name, text)
    specs = []
    for raw in texts:
        text = raw.strip()
        match = _NAME.match(text)
        kw, body = (match.group(1), match.group(2).strip()) if match else (None, text)
        if not body or body[0].isdigit():
            spec = parse_input(text)
            specs.append(spec)
            entries.append(("spec", spec, spec.name, text))
            continue
        value = _evaluate(body, namespace, global_ns, "--input")
        entries.append(("value", value, kw, text))

    device = _model_device(model)
    spec_args, spec_kwargs = make_inputs(specs, model, default_dtype=default_dtype or torch.float32, device=device)
    spec_args = list(spec_args)

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    texts_out: list[str] = []

    def put(name: Optional[str], value: Any, text: str, origin: str) -> None:
        if name is None:
            if kwargs:
                raise _InputError(f"--input {origin!r} is positional but follows a keyword input: put positional inputs first")
            args.append(value)
        else:
            if name in kwargs:
                raise _InputError(f"--input {name}= is given twice")
            kwargs[name] = value
        texts_out.append(text)

    for kind, payload, kw, text in entries:
        if kind == "spec":
            value = spec_args.pop(0) if kw is None else spec_kwargs[kw]
            put(kw, value, payload.text, text)
            continue
        value = payload
        if kw is not None:
            if not _holds_tensor(value):
                raise _InputError(f"--input {text!r}: {kw}= holds a {type(value).__name__}, with no tensor in it")
            put(kw, value, _tensor_spec_text(kw, value) if isinstance(value, torch.Tensor) else text, text)
        elif isinstance(value, torch.Tensor):
            put(None, value, _tensor_spec_text(None, value), text)
        elif isinstance(value, Mapping):
            if not any(isinstance(v, torch.Tensor) for v in value.values()):
                hint = " (tokenize with return_tensors='pt')" if value else ""
                raise _InputError(f"--input {text!r} is a dict with no tensor in it{hint}")
            for key, item in value.items():
                if not isinstance(key, str) or not key.isidentifier():
                    raise _InputError(f"--input {text!r}: key {key!r} is not a keyword argument name")
                put(key, item, _tensor_spec_text(key, item) if isinstance(item, torch.Tensor) else f"{key}=...", text)
        elif isinstance(value, (tuple, list)):
            if not any(isinstance(v, torch.Tensor) for v in value):
                raise _InputError(f"--input {text!r} is a {type(value).__name__} with no tensor in it")
            for item in value:
                put(None, item, _tensor_spec_text(None, item) if isinstance(item, torch.Tensor) else "...", text)
        else:
            raise _InputError(
                f"--input {text!r} is a {type(value).__name__}: give a tensor, a tuple/list of tensors, "
                "a dict of tensors, or a shape batch first such as 1,3,224,224"
            )
    return args, kwargs, texts_out


def _holds_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v) for v in value)
    return False


def _model_device(model: Any) -> Any:
    """Where the model's first parameter (or buffer) lives, so random inputs are made there too."""
    if model is None:
        return "cpu"
    for tensors in (model.parameters(), model.buffers()):
        for tensor in tensors:
            return tensor.device
    return "cpu"


def _file_stem(name: str) -> str:
    """The command line's default file name for a graph name."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("._")
    return safe or "model"


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
    @argument("--plan", action="store_true",
              help="send the graph (shapes and hyperparameters, never weights or code) to the plan service "
                   "(NEURARCH_API, default www.neurarch.com) and show the card; nothing is sent without "
                   "--plan or --share")
    @argument("--share", action="store_true",
              help="implies --plan; also store the graph and card at a public, unguessable URL "
                   "(anyone with the link can open it)")
    @argument("--base", metavar="FILE", default=None,
              help="a second .neurarch.json graph, the design being changed from; the card adds a diff")
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
                f"internal error: {_one_line(exc)} (run again with --verbose and report it)"
            ) from None

    def _run(self, args: Any, local_ns: Optional[dict]) -> Any:
        expr = " ".join(args.expr).strip()
        plan = bool(args.plan or args.share)
        if args.depth is not None and args.depth < 0:
            raise UsageError(f"--depth must be 0 or more, not {args.depth}")
        if args.base is not None and not plan:
            raise UsageError("--base needs --plan or --share: it is what the plan's diff compares to")
        output = args.output
        no_save = bool(args.no_save) or (output is not None and output.strip() in _NO_SAVE)
        if args.no_save and output is not None and output.strip() not in _NO_SAVE:
            raise UsageError("-o and --no-save contradict each other: give one")
        if output is not None and output.strip() == "-":
            raise UsageError("-o - (stdout) has no meaning in a notebook: the result holds the graph; use --no-save")
        if not args.input:
            raise UsageError(
                "no --input given: pass one per forward argument, batch first, e.g. --input 1,3,224,224, "
                "or the name of a tensor in the notebook, e.g. --input batch"
            )
        path = None
        if not no_save and output is not None:
            path = os.path.expanduser(output.strip())
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise UsageError(f"cannot write {path}: folder {folder} does not exist")
            if os.path.isdir(path):
                raise UsageError(f"cannot write {path}: it is a folder; give a file name ending in .neurarch.json")

        # Checked before any work, so a bad address or base file costs no trace.
        base = None
        if plan:
            from neurarch_trace.plan_client import check_api

            check_api()
            if args.base is not None:
                from neurarch_trace.graph import read_graph

                try:
                    base = read_graph(os.path.expanduser(args.base))
                except NeurarchError as err:
                    raise UsageError(f"--base: {err}") from None

        import torch

        from neurarch_trace.inputs import parse_dtype
        from neurarch_trace.targets import as_module
        from neurarch_trace.tracer import trace_model

        namespace = dict(self.shell.user_ns)
        if local_ns:
            namespace.update(local_ns)
        global_ns = self.shell.user_global_ns
        default_dtype = parse_dtype(args.dtype) if args.dtype else torch.float32

        target = _evaluate(expr, namespace, global_ns, "the model expression")
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

        if not no_save:
            from neurarch_trace.graph import write_graph

            path = path or f"{_file_stem(graph['name'])}.neurarch.json"
            try:
                write_graph(graph, path)
            except OSError as exc:
                raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None

        from neurarch_trace.notebook.result import NeurarchResult
        from neurarch_trace.plan_client import trace_source

        result = NeurarchResult(
            graph,
            path=path,
            source=trace_source(expr, spec_texts),
            base=base,
            verbose=bool(args.verbose),
        )
        if plan:
            share = bool(args.share)
            print(result.send_notice(share), flush=True)
            result.request_plan(share=share)
            if result.error:
                print(f"neurarch: plan failed: {result.error}", file=sys.stderr, flush=True)
                if result.traceback:
                    print(result.traceback, file=sys.stderr, end="", flush=True)
            elif share and result.url is None and result.share_error:
                print(f"neurarch: no share link: {result.share_error}", file=sys.stderr, flush=True)
        return result


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
