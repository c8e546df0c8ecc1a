"""A cache of meta-kernel results, so that a rehearsal costs little more than the trace.

Many meta kernels are Python decompositions (``torch._refs``, ``torch._meta_registrations``) that
cost 0.1 to 1 ms a call (a meta ``relu`` about 0.3 ms, a BatchNorm forward about 1.3 ms), where the
CPU kernel on one sample takes less. A model repeats the same layers on the same shapes, and an
operation's output metadata (shape, strides, dtype) is a function of its inputs' metadata and its
other arguments alone, so the first result is kept and later identical calls get fresh
``empty_strided`` meta tensors of the same metadata. This is the idea of ``FakeTensorMode``'s
dispatch cache (``torch._subclasses.fake_tensor``), with the same safety rules:

* only calls whose tensor arguments are all meta tensors (host tensors have values that matter:
  AdamW's step counts);
* only results made of fresh, dense tensors: no output shares a storage with an input or another
  output (views and in-place results are recomputed every time), each output's storage is exactly
  as large as its strides need, and every output is a tensor or a plain value (``None``, int);
* not a result with no tensor in it (an in-place ``_foreach_`` op returns nothing).

Mutations of meta tensors (BatchNorm's running statistics) change nothing, there being no data, so
skipping them on a hit is exact.
"""

from __future__ import annotations

from typing import Any

import torch

from neurarch_trace.metakernels import MetaKernels

__all__ = ["MetaCache"]

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_MISS = object()


_PLAIN_TYPES = frozenset(_PLAIN)


def _key(value: Any, storages: list) -> Any:
    """A hashable description of an argument, or ``_MISS`` when it cannot be cached."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is torch.Tensor or isinstance(value, torch.Tensor):
        if not value.is_meta or value.layout is not torch.strided or value.is_nested:
            return _MISS
        storages.append(id(value.untyped_storage()))
        return ("T", value.shape, value.stride(), value.storage_offset(), value.dtype)
    if kind is tuple or kind is list:
        if all(type(item) is int for item in value):  # a shape, strides, dims
            return tuple(value)
        out = []
        for item in value:
            k = _key(item, storages)
            if k is _MISS:
                return _MISS
            out.append(k)
        return tuple(out)
    if isinstance(value, _PLAIN):
        return value
    return _MISS


def _dense_nbytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return span * t.element_size()


def _describe(out: Any, inputs: set[int], seen: set[int]) -> Any:
    if isinstance(out, torch.Tensor):
        if out.device.type != "meta" or out.is_sparse or out.storage_offset() != 0:
            return _MISS
        storage = out.untyped_storage()
        key = id(storage)
        if key in inputs or key in seen or storage.nbytes() != _dense_nbytes(out):
            return _MISS
        seen.add(key)
        return ("T", tuple(out.shape), out.stride(), out.dtype)
    if isinstance(out, (int, float, bool, type(None))):
        return ("V", out)
    if isinstance(out, (list, tuple)):
        items = []
        for item in out:
            d = _describe(item, inputs, seen)
            if d is _MISS:
                return _MISS
            items.append(d)
        return ("L" if isinstance(out, list) else "U", tuple(items))
    return _MISS


def _has_tensor(desc: Any) -> bool:
    if desc[0] == "T":
        return True
    if desc[0] in ("L", "U"):
        return any(_has_tensor(d) for d in desc[1])
    return False


def _rebuild(desc: Any) -> Any:
    kind = desc[0]
    if kind == "T":
        return torch.empty_strided(desc[1], desc[2], dtype=desc[3], device="meta")
    if kind == "V":
        return desc[1]
    items = [_rebuild(d) for d in desc[1]]
    return items if kind == "L" else tuple(items)


class MetaCache:
    """``call(func, args, kwargs)`` runs ``func`` or answers from the cache. ``hits`` and
    ``misses`` count calls answered and computed (for the benchmark); a call computed runs
    through :class:`~neurarch_trace.metakernels.MetaKernels` (BatchNorm's and LayerNorm's meta
    kernels from their shape functions)."""

    def __init__(self) -> None:
        self._entries: dict[Any, Any] = {}
        self.hits = 0
        self.misses = 0
        self.kernels = MetaKernels()

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        storages: list[int] = []
        key = _key(args, storages)
        run = self.kernels.call
        if key is _MISS:
            return run(func, args, kwargs)
        if kwargs:
            named = _key(tuple(kwargs.values()), storages)
            if named is _MISS:
                return run(func, args, kwargs)
            key = (key, tuple(kwargs), named)
        key = (func, key)
        entry = self._entries.get(key)
        if entry is not None and entry is not _MISS:
            self.hits += 1
            return _rebuild(entry)
        out = run(func, args, kwargs)
        if entry is None:
            self.misses += 1
            desc = _describe(out, set(storages), set())
            self._entries[key] = desc if desc is not _MISS and _has_tensor(desc) else _MISS
        return out
