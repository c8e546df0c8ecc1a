"""Provenance: where each tensor's value came from, and the flow mode that carries it between layers.

Every tensor carries a frozenset of *provenance keys*: record indices (``int``) of the layers,
merges and inputs its value was computed from without passing through another layer, and the names
(``"param:<name>"``, ``"buffer:<name>"``) of parameters and buffers read directly in functional code.
A layer's output gets ``{its record}``; between layers, :class:`FlowMode` (a ``TorchFunctionMode``)
gives each result the union of its operands' keys, whatever the grad mode, so ``torch.no_grad()``
and ``torch.inference_mode()`` regions and integer paths are followed too.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

import neurarch_trace.walk as walk
from neurarch_trace.trace.closed_form import plain_types

if TYPE_CHECKING:  # pragma: no cover
    from neurarch_trace.trace.recorder import Recorder

__all__ = ["EMPTY", "NO_TENSOR_RESULT", "FlowMode", "Provenance"]

EMPTY: frozenset = frozenset()
#: Result types of torch calls that hold no tensor (shapes, sizes, dtypes).
NO_TENSOR_RESULT = frozenset({int, float, bool, str, torch.Size, torch.dtype, torch.device})


class Provenance:
    """The provenance keys of live tensors (see the module docstring).

    Entries are keyed by ``id(tensor)`` and hold a weak reference without a callback (the cheapest
    kind: one per tensor, shared): a new tensor at the same address as a freed one is never
    mistaken for it, as the reference is dead, and a freed tensor's entry stays until the trace
    ends (one small tuple per tensor the trace followed). Parameters and buffers of the model have
    a fixed key of their own (:attr:`tensors_by_key`).
    """

    def __init__(self, tree: walk.Tree) -> None:
        self._entries: Dict[int, Tuple[weakref.ref, frozenset]] = {}
        # parameters and buffers: id -> (provenance key, tensor)
        self._known: Dict[int, Tuple[str, torch.Tensor]] = {}
        for name, p in tree.named_parameters:
            self._known[id(p)] = (f"param:{name}", p)
        for name, b in tree.named_buffers:
            self._known.setdefault(id(b), (f"buffer:{name}", b))
        #: ``"param:<name>"`` / ``"buffer:<name>"`` -> the tensor.
        self.tensors_by_key: Dict[str, torch.Tensor] = {key: t for key, t in self._known.values()}

    def of(self, t: torch.Tensor) -> frozenset:
        """The provenance keys of ``t`` (empty for a constant)."""
        entry = self._entries.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        known = self._known.get(id(t))
        if known is not None and known[1] is t:
            return frozenset((known[0],))
        return EMPTY

    def set(self, t: torch.Tensor, prov: frozenset) -> None:
        """Record ``prov`` as the provenance of ``t``."""
        self._entries[id(t)] = (weakref.ref(t), prov)


class FlowMode(TorchFunctionMode):
    """Hands every torch function call between layers to ``recorder.on_function`` (provenance and
    merge nodes), and steps aside while a layer runs.

    Work inside a layer is not looked into, and a TorchFunctionMode costs every torch call a trip
    through Python: popping the mode off the stack for the layer's forward (:meth:`suspend`, from
    the pre-hook; :meth:`resume`, from the post-hook) keeps the trace near the speed of the bare
    forward. Only this mode is popped (when it is on top); hooks nest, so the pushes and pops pair
    up, and :meth:`restore` puts back whatever an exception left popped.
    """

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder
        self._popped: List[Optional[TorchFunctionMode]] = []

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if kwargs is None:
            kwargs = {}
        recorder = self._recorder
        if func in recorder.zero_flop_functions and plain_types(types):
            # 0 FLOPs whatever the shapes (closed_form.ZERO_FLOP_FUNCTIONS): no FLOP mode around it
            out = recorder.flop_mode.call_outside(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if recorder.inside_layer or recorder.paused or (type(out) in NO_TENSOR_RESULT and "out" not in kwargs):
            return out  # x.shape, x.size(-1), x.dim(), x.dtype: nothing to carry provenance to
        return recorder.on_function(func, args, kwargs, out)

    def suspend(self) -> None:
        """Pop this mode off the torch-function stack if it is on top (a layer starts)."""
        popped = None
        depth = torch._C._len_torch_function_stack()
        if depth > 0 and torch._C._get_function_stack_at(depth - 1) is self:
            popped = torch._C._pop_torch_function_stack()
        self._popped.append(popped)

    def resume(self) -> None:
        """Push back what the matching :meth:`suspend` popped (a layer ends)."""
        popped = self._popped.pop() if self._popped else None
        if popped is not None:
            torch._C._push_on_torch_function_stack(popped)

    def restore(self) -> None:
        """Push back everything still popped (a forward raised inside a layer)."""
        while self._popped:
            self.resume()
