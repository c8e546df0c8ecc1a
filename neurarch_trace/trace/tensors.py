"""Walking the tensors inside forward arguments and outputs, and naming them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Iterator

import torch

from neurarch_trace.text import shape_text

__all__ = ["arg_tensors", "call_tensors", "dtype_name", "iter_tensors", "named_tensors", "output_tensors",
           "tensor_text", "unique_tensors"]

#: Nesting depth past which containers are not looked into.
MAX_DEPTH = 8
#: Types that hold no tensor.
_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None), type(Ellipsis), slice})


_DTYPE_NAMES: dict = {}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def tensor_text(t: torch.Tensor) -> str:
    """``1x3x224x224 float32`` (``scalar float32`` for a 0-d tensor)."""
    return f"{shape_text([int(d) for d in t.shape])} {dtype_name(t.dtype)}"


def iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj``: tensors, lists, tuples (named ones too), dicts (and
    transformers' ``ModelOutput``), dataclasses; in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    cls = type(obj)
    if cls is tuple or cls is list:  # the common case (hook arguments), before the ABC checks
        if depth <= MAX_DEPTH:
            for value in obj:
                if isinstance(value, torch.Tensor):
                    yield value
                elif value is not None and type(value) not in _ATOMS:
                    yield from iter_tensors(value, depth + 1)
        return
    if depth > MAX_DEPTH or obj is None or cls in _ATOMS or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if cls is dict and not obj:
        return
    if isinstance(obj, Mapping):
        for value in obj.values():
            yield from iter_tensors(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, field.name, None), depth + 1)


def call_tensors(args: tuple, kwargs: dict) -> list:
    """The tensors of a call's positional, then keyword arguments (:func:`iter_tensors` of each),
    as a list; one tensor argument and no keywords (most layer calls) without the walk."""
    if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):
        return [args[0]]
    tensors = arg_tensors(args)
    if kwargs:
        tensors.extend(iter_tensors(kwargs))
    return tensors


def arg_tensors(args: tuple) -> list:
    """:func:`iter_tensors` of a call's positional arguments, as a list, without a generator for
    the common arguments (tensors and Python atoms)."""
    out = []
    for value in args:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif value is not None and type(value) not in _ATOMS:
            out.extend(iter_tensors(value, 1))
    return out


def unique_tensors(obj: Any) -> list:
    """The tensors of :func:`iter_tensors`, each once (by identity), in first-seen order: a
    tensor a result holds twice (``torch.distributions.Categorical`` keeps ``logits`` and
    ``_param`` as one tensor, a forward returning ``(h, [h1, h])``) is one output."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    seen: set = set()
    out = []
    for t in iter_tensors(obj):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def output_tensors(output: Any) -> list:
    """The tensors a forward returned, each once: those of :func:`unique_tensors`, or, for an
    object that is no container (a ``torch.distributions.Categorical``), the tensors it holds."""
    outs = unique_tensors(output)
    if not outs and hasattr(output, "__dict__") and not isinstance(output, torch.nn.Module):
        outs = unique_tensors(list(vars(output).values()))
    return outs


def named_tensors(name: str, value: Any, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside one forward argument, named by its path: ``xs.0``, ``batch.image``."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif depth > MAX_DEPTH or value is None or isinstance(value, (str, bytes)):
        return
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from named_tensors(f"{name}.{key}", item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from named_tensors(f"{name}.{i}", item, depth + 1)
