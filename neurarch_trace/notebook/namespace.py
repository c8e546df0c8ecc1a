"""The magic's ``--input`` values and model argument, read from the notebook's namespace.

No IPython here: :func:`resolve_inputs` and :func:`evaluate` take plain mappings (the user's
namespace), so the command line, a test or another front end can use them; torch is imported when
they run. Every user error is a :class:`~neurarch_trace.errors.NeurarchError` whose ``str()`` is
one line (the magic shows it as a ``UsageError``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

from neurarch_trace.errors import NeurarchError
from neurarch_trace.text import error_line
from neurarch_trace.trace_options import TARGET_FORMS

__all__ = ["InputError", "evaluate", "is_shape_spec", "model_kind", "resolve_inputs"]

_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(?!=)(.*)$", re.S)
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class InputError(NeurarchError):
    """An ``--input`` (or model expression) that names nothing usable in the namespace."""


def _tensor_spec_text(name: Optional[str], tensor: Any) -> str:
    """A tensor written back as an ``--input`` spec (``attention_mask=1,16:int64``), for ``source``."""
    from neurarch_trace.tracer import dtype_name

    dims = ",".join(str(int(d)) for d in tensor.shape) or "1"
    prefix = f"{name}=" if name else ""
    return f"{prefix}{dims}:{dtype_name(tensor.dtype)}"


def model_kind(text: str) -> str:
    """How the magic reads its model argument: ``"expression"`` or ``"target"``.

    The rule: valid Python is an expression (evaluated in the notebook). Anything else that has a
    target's form is a target, loaded as the command line loads it: ``hf:<id or folder>``,
    ``FILE:Attr`` where FILE ends in ``.py`` or names a folder (``examples/models/resnet.py:ResNet18``),
    ``pkg.mod:attr`` (dotted names on both sides). No target form is valid Python (a colon outside
    brackets is a syntax error), so the two never overlap: ``resnet`` is the notebook's variable
    even where a module ``resnet`` exists, ``resnet:ResNet18`` is the module's attribute even where
    the notebook has a variable ``resnet``, and ``models[1:2]`` stays a slice.

    Raises:
        InputError: ``text`` is neither valid Python nor of a target's form.
    """
    try:
        compile(text, "<the model expression>", "eval")
        return "expression"
    except SyntaxError as exc:
        why = exc.msg
    if text.startswith("hf:"):
        return "target"
    where, colon, attr = text.rpartition(":")
    is_path = where.endswith(".py") or "/" in where or os.sep in where
    if colon and where and _DOTTED.match(attr) and (is_path or _DOTTED.match(where)):
        return "target"
    if colon:
        raise InputError(f"{text!r} is neither a Python expression ({why}) nor a target ({TARGET_FORMS})")
    raise InputError(f"the model expression {text!r} is not a Python expression ({why})")


def is_shape_spec(text: str) -> bool:
    """True when an ``--input`` value is a shape spec (``[NAME=]D0,D1,...[:dtype]``: it starts with
    a digit after any ``NAME=``), False when it names notebook data (``[NAME=]EXPR``)."""
    body = _split(text.strip())[1]
    return not body or body[0].isdigit()


def _split(text: str) -> tuple:
    """``(keyword name or None, the rest)`` of an ``--input`` value."""
    match = _NAME.match(text)
    return (match.group(1), match.group(2).strip()) if match else (None, text)


def evaluate(text: str, namespace: Mapping[str, Any], global_ns: Mapping[str, Any], what: str) -> Any:
    """The value of the Python expression ``text`` in the user's namespace; ``what`` names it in
    errors (``--input``, ``the model expression``).

    Raises:
        InputError: a syntax error, an unknown name, or the expression raised.
    """
    try:
        code = compile(text, f"<{what}>", "eval")
    except SyntaxError as exc:
        raise InputError(f"{what} {text!r} is not a Python expression ({exc.msg})") from exc
    try:
        return eval(code, dict(global_ns), dict(namespace))  # noqa: S307 - the user's own notebook
    except NameError as exc:
        missing = getattr(exc, "name", None) or text
        raise InputError(f"{what} {text!r}: no variable named {missing!r} in the notebook; "
                         "run the cell that defines it first") from exc
    except Exception as exc:  # noqa: BLE001 - the user's own code can raise anything
        raise InputError(f"{what} {text!r} failed: {error_line(exc)}") from exc


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

    from neurarch_trace.inputs import make_inputs

    entries, specs = _entries(texts, namespace, namespace if global_ns is None else global_ns)
    device = _model_device(model)
    spec_args, spec_kwargs = make_inputs(specs, model, default_dtype=default_dtype or torch.float32, device=device,
                                         meta_hint=False)  # a live model is never moved to meta
    spec_args = list(spec_args)
    out = _Arguments()
    for kind, payload, kw, text in entries:
        if kind == "spec":
            out.put(kw, spec_args.pop(0) if kw is None else spec_kwargs[kw], payload.text, text)
        else:
            _put_value(out, payload, kw, text)
    return out.args, out.kwargs, out.texts


def _entries(texts: list[str], namespace: Mapping[str, Any],
             global_ns: Mapping[str, Any]) -> tuple[list[tuple[str, Any, Optional[str], str]], list]:
    """Each ``--input`` as ``(kind, payload, keyword name, text)``: a parsed shape spec
    (``kind`` ``spec``) or an evaluated expression (``value``); and the specs alone."""
    from neurarch_trace.inputs import parse_input

    entries: list[tuple[str, Any, Optional[str], str]] = []
    specs = []
    for raw in texts:
        text = raw.strip()
        kw, body = _split(text)
        if is_shape_spec(text):
            spec = parse_input(text)
            specs.append(spec)
            entries.append(("spec", spec, spec.name, text))
        else:
            entries.append(("value", evaluate(body, namespace, global_ns, "--input"), kw, text))
    return entries, specs


class _Arguments:
    """Forward arguments being collected, positional first, and each one written back as a spec."""

    def __init__(self) -> None:
        self.args: list[Any] = []
        self.kwargs: dict[str, Any] = {}
        self.texts: list[str] = []

    def put(self, name: Optional[str], value: Any, text: str, origin: str) -> None:
        if name is None:
            if self.kwargs:
                raise InputError(f"--input {origin!r} is positional but follows a keyword input: "
                                 "put positional inputs first")
            self.args.append(value)
        else:
            if name in self.kwargs:
                raise InputError(f"--input {name}= is given twice")
            self.kwargs[name] = value
        self.texts.append(text)


def _put_value(out: _Arguments, value: Any, kw: Optional[str], text: str) -> None:
    """Pass a namespace value on: as keyword ``kw``, as one tensor, spread from a dict (keywords)
    or a tuple/list (positional)."""
    import torch

    if kw is not None:
        if not _holds_tensor(value):
            raise InputError(f"--input {text!r}: {kw}= holds a {type(value).__name__}, with no tensor in it")
        out.put(kw, value, _tensor_spec_text(kw, value) if isinstance(value, torch.Tensor) else text, text)
    elif isinstance(value, torch.Tensor):
        out.put(None, value, _tensor_spec_text(None, value), text)
    elif isinstance(value, Mapping):
        if not any(isinstance(v, torch.Tensor) for v in value.values()):
            hint = " (tokenize with return_tensors='pt')" if value else ""
            raise InputError(f"--input {text!r} is a dict with no tensor in it{hint}")
        for key, item in value.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise InputError(f"--input {text!r}: key {key!r} is not a keyword argument name")
            out.put(key, item, _tensor_spec_text(key, item) if isinstance(item, torch.Tensor) else f"{key}=...", text)
    elif isinstance(value, (tuple, list)):
        if value and all(type(v) is int for v in value):  # a shape that is no shape spec (-1,4): say why
            from neurarch_trace.inputs import parse_input

            parse_input(text)
        if not any(isinstance(v, torch.Tensor) for v in value):
            raise InputError(f"--input {text!r} is a {type(value).__name__} with no tensor in it")
        for item in value:
            out.put(None, item, _tensor_spec_text(None, item) if isinstance(item, torch.Tensor) else "...", text)
    else:
        raise InputError(
            f"--input {text!r} is a {type(value).__name__}: give a tensor, a tuple/list of tensors, "
            "a dict of tensors, or a shape batch first such as 1,3,224,224"
        )


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
    import neurarch_trace.walk as walk  # the model's own methods may be shadowed

    if model is None:
        return "cpu"
    for tensors in (walk.parameters(model), walk.buffers(model)):
        for tensor in tensors:
            return tensor.device
    return "cpu"
