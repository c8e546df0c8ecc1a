"""What the trace holds still around the forward pass: PyTorch's fused fast paths, and the model's
own state.

**Fast paths.** In ``eval()`` mode with autograd off (``torch.no_grad()``, ``inference_mode()``,
or frozen parameters), nn.MultiheadAttention, nn.TransformerEncoderLayer and nn.TransformerEncoder
skip their ops for fused kernels (``aten._native_multi_head_attention``,
``aten._transformer_encoder_layer_fwd``) and, given a padding mask, nested tensors. No FLOP formula
reads those kernels, and which one runs depends on the grad mode, the mask and the dtype: the same
model would count differently with and without a mask. :func:`fast_paths_off` turns them off
(``torch.backends.mha.set_fastpath_enabled(False)``, the switch all three read) for the trace and
back on after: the layers then run their documented composite ops (in-projection, scaled
dot-product attention, out-projection, the feed-forward linears), which are counted the same way
whatever the grad mode or the mask.

**The model's state.** A forward may write its own state: a running statistic in a custom
normaliser, a step counter, a cache. :func:`state_kept` puts back, after the trace, whatever the
forward changed of

* every buffer, by value (a copy of each buffer is taken before, all of one dtype and device in
  one flat tensor; buffers are small next to the weights) and by identity (a buffer rebound to a
  new tensor gets the old one back);
* every parameter, by identity; by value the parameters of modules whose class is neither
  PyTorch's nor transformers' (a user's own layer may write its weight; those libraries' layers
  never do), so the big weights of nn.Linear, nn.Conv2d, nn.Embedding, GPT-2's Conv1D, ... are
  never copied;
* attributes of a user's modules rebound during the forward (``self.calls += 1``, ``self.cache =
  t``) to the object they held before.

A value is written back only when it changed, so a tensor the forward left alone is not touched
and autograd graphs the caller holds stay valid: a buffer of a PyTorch or transformers layer when
its version counter moved (every in-place op moves it; those layers write their buffers only so:
BatchNorm's running statistics, a quantization observer's range), a user's tensor also when its
values differ bitwise (a write through ``.data`` moves no counter). Tensors on
the meta device hold no values and are not copied; nor are lazy modules' uninitialised parameters
(their materialisation in the first forward is kept, as PyTorch keeps it). Not restored: a plain
tensor attribute (neither a parameter nor a buffer) written in place, and a library layer's weight
written in place from outside it (a :class:`UserWarning` names it when its version counter moved).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterator, List, Tuple

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors

import neurarch_trace.walk as walk

__all__ = ["fast_paths_off", "state_kept"]


@contextlib.contextmanager
def fast_paths_off() -> Iterator[None]:
    """PyTorch's fused attention/encoder fast paths off within the block, as they were after."""
    mha = getattr(torch.backends, "mha", None)
    get = getattr(mha, "get_fastpath_enabled", None)
    set_ = getattr(mha, "set_fastpath_enabled", None)
    if get is None or set_ is None:  # pragma: no cover - every supported torch has the switch
        yield
        return
    was = bool(get())
    set_(False)
    try:
        yield
    finally:
        set_(was)


#: A lazy module's parameter or buffer before its first forward (``nn.parameter.is_lazy``).
_LAZY = nn.parameter.UninitializedTensorMixin


def _has_values(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_meta and not isinstance(t, _LAZY)


#: Libraries whose layers never write their own weights in ``forward``: their parameters are not
#: copied (GPT-2's 85M parameters live in transformers' Conv1D, LLaMA's in nn.Linear).
_LIBRARIES = ("torch.", "transformers.")


_LIBRARY_TYPES: Dict[type, bool] = {}


def _library_class(module: nn.Module) -> bool:
    cls = type(module)
    library = _LIBRARY_TYPES.get(cls)
    if library is None:
        library = _LIBRARY_TYPES[cls] = cls.__module__.startswith(_LIBRARIES)
    return library


_SKIP_ATTRS = frozenset({"training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})

Registry = Dict[str, Any]
_EMPTY: Registry = {}  # shared, never written: a module with nothing of a kind to put back


#: The tensor types whose values one flat copy can hold (:func:`_flatten_dense_tensors`).
_FLAT_TYPES = (torch.Tensor, nn.Parameter, getattr(nn, "Buffer", nn.Parameter))


class _Kept:
    """Tensors of one dtype and device kept by value: their versions, shapes and one flat copy of
    their values (``_flatten_dense_tensors``, one kernel for them all), or, for a tensor no flat
    copy can hold (sparse, quantized, a subclass), a copy of its own (``single``)."""

    def __init__(self, tensors: List[torch.Tensor], library: List[bool], single: bool = False) -> None:
        self.tensors, self.library = tensors, library
        self.versions = [t._version for t in tensors]
        self.shapes = [t.shape for t in tensors]
        self.dtype, self.device = tensors[0].dtype, tensors[0].device
        self.user = not all(library)
        self.single = single
        if single:
            self.flat = tensors[0].detach().clone()
        else:
            flat = _flatten_dense_tensors(tensors)
            self.flat = flat.clone() if len(tensors) == 1 else flat  # one tensor comes back as a view of itself

    def restore(self) -> None:
        """Put back each tensor that changed (see the module docstring)."""
        tensors, dtype, device = self.tensors, self.dtype, self.device
        versions = [t._version for t in tensors]
        shapes = [t.shape for t in tensors]
        if not self.user and versions == self.versions and shapes == self.shapes \
                and all(t.dtype == dtype and t.device == device for t in tensors):
            return  # the common case: library layers' buffers the forward left alone
        start = 0
        for t, library, version, shape, was, before in zip(tensors, self.library, versions, shapes, self.versions,
                                                           self.shapes):
            size = before.numel()
            copy = self.flat if self.single else self.flat[start:start + size].view(before)
            start += size
            if shape != before or t.dtype != dtype or t.device != device:
                t.data = copy.clone()  # rebound through .data: its old size back, in storage of its own
            elif version != was or (not library and not torch.equal(t, copy)):  # .data writes move no counter
                t.copy_(copy)


class _Snapshot:
    """The state of one model before the trace (see the module docstring)."""

    def __init__(self, tree: walk.Tree, values: bool = True) -> None:
        self.modules: List[Tuple[nn.Module, Registry, Registry, Registry]] = []
        self._kept: List[_Kept] = []
        # the library layers' parameters: (module path, name, tensor), and their versions
        self._params: List[Tuple[str, str, torch.Tensor]] = []
        self._param_versions: List[int] = []
        by_value: Dict[int, Tuple[torch.Tensor, bool]] = {}  # id -> (tensor, a library layer's)
        library_params: Dict[int, Tuple[str, str, torch.Tensor]] = {}
        for qual, module in tree.named_modules:
            library = _library_class(module)
            params, buffers = module._parameters, module._buffers
            if (params or buffers or not library) and not isinstance(module, torch.jit.ScriptModule):
                # TorchScript rebinds nothing from Python; the libraries' layers rebind no attribute
                # in forward: only a user's classes' are kept (and nothing of a ReLU's)
                attrs = _EMPTY if library else {k: v for k, v in vars(module).items() if k not in _SKIP_ATTRS}
                self.modules.append((module, dict(params) if params else _EMPTY, dict(buffers) if buffers else _EMPTY,
                                     attrs))
            if not values:
                continue
            for t in buffers.values():
                if t is not None:
                    by_value.setdefault(id(t), (t, library))
            for name, t in params.items():
                if t is None:
                    continue
                if not library:
                    by_value.setdefault(id(t), (t, False))
                else:
                    library_params.setdefault(id(t), (qual, name, t))
        if not values:
            return
        self._params = [entry for entry in library_params.values() if _has_values(entry[2])]
        self._param_versions = [entry[2]._version for entry in self._params]
        groups: Dict[Tuple[torch.dtype, torch.device], Tuple[List[torch.Tensor], List[bool]]] = {}
        with torch.no_grad():
            for t, library in by_value.values():
                if not _has_values(t):
                    continue
                if type(t) in _FLAT_TYPES and t.layout == torch.strided and not t.is_quantized:
                    tensors, flags = groups.setdefault((t.dtype, t.device), ([], []))
                    tensors.append(t)
                    flags.append(library)
                else:
                    self._kept.append(_Kept([t], [library], single=True))
            self._kept.extend(_Kept(tensors, flags) for tensors, flags in groups.values())

    def restore(self) -> None:
        """Put back what changed: registry entries and attributes by identity, then values."""
        for module, params, buffers, attrs in self.modules:
            for registry, before in ((module._parameters, params), (module._buffers, buffers)):
                for name, t in before.items():
                    if registry.get(name) is not t:
                        registry[name] = t
            if attrs:
                current = vars(module)
                for key, value in attrs.items():
                    if key in current and current[key] is not value:
                        current[key] = value
        with torch.no_grad():
            for kept in self._kept:
                kept.restore()
        versions = [entry[2]._version for entry in self._params]
        if versions == self._param_versions:
            return
        moved = [f"{qual}.{name}" if qual else name
                 for (qual, name, t), before in zip(self._params, self._param_versions) if t._version != before]
        warnings.warn(
            f"the forward wrote {len(moved)} parameter(s) of PyTorch or transformers layers in place "
            f"({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}); the trace keeps no copy of "
            "those, so they keep the new values",
            UserWarning, stacklevel=4,
        )


@contextlib.contextmanager
def state_kept(tree: walk.Tree, values: bool = True) -> Iterator[None]:
    """Within the block the forward may change the parameters, buffers and attributes of the
    model ``tree`` walked; after it (whatever happens) they are put back as the module docstring
    says. With ``values=False``, only the registries and attributes: for a block that puts
    tensor values back itself (the training-step rehearsal, whose forward runs on meta copies)."""
    snapshot = _Snapshot(tree, values)
    try:
        yield
    finally:
        snapshot.restore()
