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

* every buffer, by value (a copy of each buffer is taken before; buffers are small next to the
  weights) and by identity (a buffer rebound to a new tensor gets the old one back);
* every parameter, by identity; by value the parameters of modules whose class is neither
  PyTorch's nor transformers' (a user's own layer may write its weight; those libraries' layers
  never do), so the big weights of nn.Linear, nn.Conv2d, nn.Embedding, GPT-2's Conv1D, ... are
  never copied;
* attributes of a user's modules rebound during the forward (``self.calls += 1``, ``self.cache =
  t``) to the object they held before.

A value is written back only when it changed (bitwise, or its version counter moved), so a tensor
the forward left alone is not touched and autograd graphs the caller holds stay valid. Tensors on
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


class _Snapshot:
    """The state of one model before the trace (see the module docstring)."""

    def __init__(self, tree: walk.Tree, values: bool = True) -> None:
        self.modules: List[Tuple[nn.Module, Registry, Registry, Registry]] = []
        self.values: Dict[int, Tuple[torch.Tensor, torch.Tensor, int]] = {}
        # the library layers' parameters: id -> (module path, name, tensor, version); named if moved
        self.versions: Dict[int, Tuple[str, str, torch.Tensor, int]] = {}
        versions = self.versions
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
                self._keep(t)
            for name, t in params.items():
                if not library:
                    self._keep(t)
                elif id(t) not in versions and _has_values(t):
                    versions[id(t)] = (qual, name, t, t._version)

    def _keep(self, t: Any) -> None:
        if _has_values(t) and id(t) not in self.values:
            self.values[id(t)] = (t, t.detach().clone(), t._version)

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
            for t, copy, version in self.values.values():
                if t.shape != copy.shape or t.dtype != copy.dtype or t.device != copy.device:
                    t.data = copy  # rebound through .data: the old storage back
                elif t._version != version or not torch.equal(t, copy):
                    t.copy_(copy)
        moved = [f"{qual}.{name}" if qual else name
                 for qual, name, t, version in self.versions.values() if t._version != version]
        if moved:
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
