"""The batch axis of each tensor, followed from the inputs through the data flow, and the shapes
without it.

The inputs are read batch first: the batch size is the first input's first dim, and an input
carries the batch on axis 0 when its first dim is that size (an input without it has no batch, or,
when another of its axes has that size, one the trace cannot tell). The tensors of a list of
samples (a list of dicts, as detection models take) are samples, and the batch is the list's
length. From there every tensor's *batch state* (:mod:`.axes`) is followed:

* through functional code between layers by each torch function's semantics (:func:`.axes.follow`);
* into a layer: sequence-first layers say where their batch is (nn.RNNBase: axis 1 for the
  sequence unless ``batch_first``, axis 1 always for ``h_n``/``c_n``; nn.MultiheadAttention and
  nn.Transformer* with ``batch_first=False``: axis 1), otherwise the input's own state is kept;
* out of a layer: known sequence-first layers as above (the attention weights of
  nn.MultiheadAttention are batch first either way); every other layer's outputs inherit the
  batch axis of its leading input (the first one that carries a batch; a transformers rotary
  embedding's position ids) at the same axis counted from the front (torch.nn's layers are batch
  first and change only trailing axes: nn.Linear, nn.Embedding, nn.Flatten, convolutions), or,
  failing that, from the back, when the size there is the batch's; a layer fed nothing batched
  gives nothing batched.

A sequence-first model called with ``(L, N, E)`` reveals its batch when its first sequence-first
layer receives a model input (:class:`BatchSize`); the inputs are read again then.

A shape is kept whole during the trace as a :class:`RawShape` with its state; :func:`strip` drops
the batch axis once the trace is over, and reports a shape whose batch axis could not be followed
(kept whole: ``measured.batchUnknown`` names it, see ``docs/measured.md``).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.trace.axes import (
    NO_BATCH,
    SAMPLE,
    SIZED_FACTORIES,
    UNKNOWN,
    Call,
    Merged,
    call_key,
    combine,
    follow,
    has_rule,
    known,
    sized_state,
)
from neurarch_trace.trace.modules import inner, is_recurrent
from neurarch_trace.trace.tensors import iter_tensors

__all__ = ["BatchAxes", "BatchSize", "RawShape", "known_batch_axis", "sample_inputs", "strip"]

State = Any  # an axis, NO_BATCH, SAMPLE, UNKNOWN or a Merged axis (see .axes)

#: Functions that size a tensor without a batch from Python ints (see .axes.sized_state).
_SIZING = frozenset({"expand", "broadcast_to", "repeat", "tile", "new_zeros", "new_ones", "new_empty", "new_full"})


class RawShape(tuple):
    """``(shape, state)``: the full shape and its batch state (:mod:`.axes`)."""

    def __new__(cls, shape: tuple, state: State) -> RawShape:
        return super().__new__(cls, (shape, state))


def _raw(shape: tuple, state: State) -> RawShape:
    """``RawShape(shape, state)`` without the Python ``__new__`` (the layer hooks make one per
    tensor)."""
    return tuple.__new__(RawShape, (shape, state))


def strip(raw: Optional[RawShape]) -> Tuple[List[int], bool]:
    """``(shape without its batch axis, whether the batch axis was unknown)``: the axis of the
    state removed (a merged axis divided by the batch's extent); a tensor without a batch, or one
    sample, keeps its whole shape; so does one whose batch axis could not be followed (the flag
    is then True)."""
    if raw is None:
        return [], False
    shape, state = raw
    if not shape:
        return [], False
    if isinstance(state, Merged):
        if state.axis < len(shape) and state.extent > 0 and shape[state.axis] % state.extent == 0:
            return [d // state.extent if i == state.axis else d for i, d in enumerate(shape)], False
        return list(shape), True
    if state is UNKNOWN:
        return list(shape), True
    if not known(state) or state >= len(shape):
        return list(shape), False
    return list(shape[:state] + shape[state + 1:]), False


def _transformer_batch_first(target: nn.Module) -> Optional[bool]:
    batch_first = getattr(target, "batch_first", None)
    cls = type(target)
    torch_transformer = cls.__module__.startswith("torch.nn") and cls.__name__.startswith("Transformer")
    if batch_first is None and torch_transformer:
        attn = next((m for m in walk.modules(target) if isinstance(m, nn.MultiheadAttention)), None)
        batch_first = attn.batch_first if attn is not None else None
    return batch_first


def known_batch_axis(module: Optional[nn.Module], index: int, ndim: int, is_output: bool) -> Optional[int]:
    """The batch axis of the ``index``-th input (or output) tensor of ``module`` with ``ndim``
    dims, when the layer's type fixes it; None when it does not (NO_BATCH: the tensor is
    unbatched)."""
    if module is None:
        return None
    target = inner(module)
    if is_recurrent(target):
        if index == 0:
            if ndim == 2:
                return SAMPLE
            return 0 if target.batch_first else 1
        return 1 if ndim == 3 else SAMPLE
    is_mha = isinstance(target, nn.MultiheadAttention)
    if not is_mha and not type(target).__name__.startswith("Transformer"):
        return None  # the common case, without the attribute look-ups below
    batch_first = _transformer_batch_first(target)
    if is_mha or (batch_first is False and type(target).__name__.startswith("Transformer")):
        if isinstance(target, nn.MultiheadAttention) and is_output and index == 1:
            return 0 if ndim >= 3 else SAMPLE  # attention weights are (N, L, S) in either layout
        if ndim == 3:
            return 0 if batch_first else 1
    return None


#: :func:`fixes_no_batch_axis` of the classes it answers by class alone.
_FREE_CLASSES: Dict[type, bool] = {}
_QUANTIZED = "torch.ao.nn.quantized"


def fixes_no_batch_axis(module: nn.Module) -> bool:
    """Whether the type of ``module`` fixes no batch axis: every one but the sequence-first kinds
    (recurrent layers, nn.MultiheadAttention, nn.Transformer*), for which :func:`known_batch_axis`
    is None for any tensor. Kept per class, for every class but an :class:`~.modules.Opaque`
    wrapper's (whose answer is the wrapped module's) and the quantized ones (whose recurrent check
    reads the module's attributes)."""
    target = inner(module)
    free = not (is_recurrent(target) or isinstance(target, nn.MultiheadAttention)
                or type(target).__name__.startswith("Transformer"))
    cls = type(module)
    if target is module and not cls.__module__.startswith(_QUANTIZED):
        _FREE_CLASSES[cls] = free
    return free


def _input_state(t: torch.Tensor, batch: int) -> State:
    """An input read batch first: axis 0 when its first dim is the batch size."""
    shape = tuple(int(d) for d in t.shape)
    if not shape:
        return NO_BATCH
    if shape[0] == batch:
        return 0
    return UNKNOWN if batch in shape else NO_BATCH


def _is_sample_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def sample_inputs(named_inputs: Sequence[Tuple[str, Any]]) -> Tuple[Optional[int], set]:
    """``(batch size, ids of sample tensors)`` of the forward's arguments: an argument that is a
    list of dicts is a list of samples (its length is the batch when it comes first)."""
    batch: Optional[int] = None
    samples: set = set()
    for _, value in named_inputs:
        if _is_sample_list(value):
            found = list(iter_tensors(value))
            samples.update(id(t) for t in found)
            if batch is None and found:
                batch = len(value)
        elif batch is None and isinstance(value, torch.Tensor) and value.dim() > 0:
            batch = int(value.shape[0])
        elif batch is None and isinstance(value, (list, tuple, Mapping)):
            first = next((t for t in iter_tensors(value) if t.dim() > 0), None)
            batch = int(first.shape[0]) if first is not None else None
    return batch, samples


class BatchSize:
    """The batch size: the first input's first dim (a list of samples: its length), unless a
    sequence-first layer fed straight from a model input says otherwise (``--input`` is read
    batch first, but a sequence-first model is called with ``(L, N, E)``)."""

    def __init__(self, traced: int) -> None:
        self.value = traced
        self._learned = False
        #: the shape of the tensor the sequence-first layer was fed when the batch was learned
        self.fed_shape: Optional[Tuple[int, ...]] = None

    def learn(self, module: nn.Module, t: torch.Tensor, prov: frozenset, records: List[Any]) -> bool:
        """Read the batch off ``t``, the first input of ``module``, when its provenance ``prov``
        says it comes straight from a model input (an ``input`` record of ``records``); True when
        the batch size was learned now."""
        if self._learned or t.dim() != 3:
            return False
        axis = known_batch_axis(module, 0, 3, False)
        if axis != 1 or not any(isinstance(k, int) and records[k].type == "input" for k in prov):
            return False
        self._learned = True
        self.value = int(t.shape[1])
        self.fed_shape = tuple(t.shape)
        return True

    def adopt(self, value: int, fed_shape: Tuple[int, ...]) -> None:
        """Take the batch size another trace of the same call learned (the full-depth trace, when
        a depth cuts the layer that tells it off: ``--depth 0`` makes the whole model one node)."""
        self.value, self.fed_shape, self._learned = value, fed_shape, True


class BatchAxes:
    """The batch state of every live tensor of the trace (weak references without callbacks, as
    :class:`~.provenance.Provenance` keeps them); a tensor never seen (a parameter, a constant, a
    tensor made from constants) has none (NO_BATCH)."""

    def __init__(self, batch: BatchSize) -> None:
        self._states: Dict[int, Tuple[weakref.ref, State]] = {}
        self._batch = batch
        # modules whose type fixes no batch axis (every one but the sequence-first kinds): id -> True
        self._free: Dict[int, bool] = {}
        # layer outputs recorded UNKNOWN, which a later merge may explain: id -> (tensor, shapes, index)
        self._pending: Dict[int, Tuple[weakref.ref, List[RawShape], int]] = {}
        self._inputs: List[Tuple[Any, torch.Tensor, bool]] = []
        # the states :func:`.axes.follow` gave each call key (.axes.call_key): a repeated block once
        self._followed: Dict[tuple, List[State]] = {}

    def of(self, t: torch.Tensor) -> State:
        """The batch state of ``t``."""
        entry = self._states.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        return NO_BATCH

    def set(self, t: torch.Tensor, state: State) -> None:
        """Record ``state`` for ``t`` (nothing to record for NO_BATCH on an unseen tensor)."""
        key = id(t)
        states = self._states
        if state == NO_BATCH and key not in states:
            return
        states[key] = (weakref.ref(t), state)

    def refine(self, t: torch.Tensor, state: State) -> None:
        """A merge explained the lost batch state of ``t``: record it, and on the layer output
        shape ``t`` was recorded with."""
        self.set(t, state)
        pending = self._pending.pop(id(t), None)
        if pending is not None and pending[0]() is t:
            shapes, index = pending[1], pending[2]
            shapes[index] = RawShape(shapes[index][0], state)

    def shape(self, t: torch.Tensor, state: Any = False) -> RawShape:
        """The raw shape of ``t`` with its state (or ``state`` when given)."""
        return _raw(tuple(t.shape), self.of(t) if state is False else state)

    # --- inputs ---------------------------------------------------------------------------------
    def add_input(self, record: Any, t: torch.Tensor, is_sample: bool) -> RawShape:
        """Give a model input its state; returns its raw shape."""
        state = SAMPLE if is_sample else _input_state(t, self._batch.value)
        self._inputs.append((record, t, is_sample))
        self.set(t, state)
        return self.shape(t, state)

    def relearn(self, fed: torch.Tensor, axis: int) -> None:
        """The batch size was learned from ``fed`` (a sequence-first layer's input, batch on
        ``axis``): read every input again (:meth:`reread_inputs`); ``fed`` carries it there."""
        self.reread_inputs(tuple(fed.shape), axis)
        self.set(fed, axis)

    def reread_inputs(self, fed_shape: Tuple[int, ...], axis: int) -> None:
        """Read every input again after the batch size was learned from a tensor of shape
        ``fed_shape`` with the batch on ``axis``: an input of that shape carries it there, any
        other is read batch first again."""
        for record, t, is_sample in self._inputs:
            if is_sample:
                continue
            state = axis if tuple(t.shape) == fed_shape else _input_state(t, self._batch.value)
            self.set(t, state)
            record.output_shapes = [self.shape(t, state)]

    # --- functional code --------------------------------------------------------------------------
    def follow(self, func: Any, name: str, args: tuple, kwargs: dict, ins: List[torch.Tensor],
               outs: List[torch.Tensor]) -> None:
        """Give the outputs of one torch function between layers their states (in-place results
        keep theirs)."""
        if not outs:
            return  # no tensor out (x.shape)
        if name not in _SIZING:
            table = self._states
            for t in ins:
                entry = table.get(id(t))
                if entry is not None and entry[0]() is t:
                    break
            else:
                return  # nothing batched in: nothing batched out
        if name == "__get__":
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        if len(ins) == 1 and len(outs) == 1 and not kwargs and args and args[0] is ins[0] and not has_rule(name):
            x, out = ins[0], outs[0]
            state = self.of(x)
            if out.shape == x.shape and not isinstance(state, Merged):
                # a shape-keeping function of one tensor (.contiguous(), dropout, an activation):
                # what follow()'s default rule gives, without the call key
                if out is not x:
                    self.set(out, state)
                return
        key = call_key(func, name, args, kwargs, outs, self.of, self._batch.value)
        states = self._followed.get(key) if key is not None else None
        if states is None:
            states = follow(Call(name, args, kwargs, self.of, self._batch.value), func, outs)
            if key is not None:
                self._followed[key] = states
        for out, state in zip(outs, states):
            for t in ins:
                if out is t:
                    break  # in place: it keeps its state
            else:
                self.set(out, state)

    def made(self, name: str, out: Any) -> None:
        """A tensor made from no tensor and explicit sizes (``torch.zeros(b, 8)``): the state
        :func:`.axes.sized_state` gives its sizes."""
        if name in SIZED_FACTORIES and isinstance(out, torch.Tensor):
            self.set(out, sized_state([int(d) for d in out.shape], self._batch.value))

    # --- layers ---------------------------------------------------------------------------------
    def _free_of(self, module: nn.Module) -> bool:
        """:func:`fixes_no_batch_axis`, cached per module for the modules it does not answer by
        class."""
        free = _FREE_CLASSES.get(type(module))
        if free is None:
            free = self._free.get(id(module))
            if free is None:
                free = self._free[id(module)] = fixes_no_batch_axis(module)
        return free

    def layer_input(self, module: nn.Module, t: torch.Tensor) -> RawShape:
        """The raw shape of the first input of a layer: the layer's own axis when it fixes one."""
        axis = None if self._free_of(module) else known_batch_axis(module, 0, t.dim(), False)
        return _raw(tuple(t.shape), self.of(t) if axis is None else axis)

    def leaf_input(self, module: nn.Module, x: torch.Tensor, prov: frozenset, records: List[Any]) -> RawShape:
        """The raw shape of ``x``, the one input tensor of a layer call (the recorder's path for a
        leaf layer), of provenance ``prov``: a sequence-first layer fed a model input may reveal the
        batch size first (:meth:`BatchSize.learn`, :meth:`relearn`), then :meth:`layer_input`; in
        one frame for a layer whose type fixes no batch axis (whose input tells nothing)."""
        free = _FREE_CLASSES.get(type(module))
        if free is None:
            free = self._free_of(module)
        if not free:
            if self._batch.learn(module, x, prov, records):
                self.relearn(x, 1)
            return self.layer_input(module, x)
        entry = self._states.get(id(x))
        return _raw(tuple(x.shape), entry[1] if entry is not None and entry[0]() is x else NO_BATCH)

    def leaf_output(self, module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> List[RawShape]:
        """:meth:`layer_outputs` for a layer with one input tensor ``x`` and one output tensor
        ``out``, in one frame for a layer whose type fixes no batch axis (the output inherits the
        input's state, :func:`_inherit`)."""
        free = _FREE_CLASSES.get(type(module))
        if free is None:
            free = self._free_of(module)
        if not free:
            return self.layer_outputs(module, "customModule", [x], [out])
        states = self._states
        entry = states.get(id(x))
        state = entry[1] if entry is not None and entry[0]() is x else NO_BATCH
        shape = tuple(out.shape)
        if type(state) is int and state >= 0:  # the common case: _inherit's first candidate, the same axis
            if not (state < len(shape) and shape[state] == x.shape[state]):
                state = _inherit(x, state, out)
        elif isinstance(state, Merged):
            state = _inherit(x, state, out)
        key = id(out)
        if state != NO_BATCH or key in states:  # as set() does
            states[key] = (weakref.ref(out), state)
        shapes = [_raw(shape, state)]
        if state is UNKNOWN:
            self._pending[key] = (weakref.ref(out), shapes, 0)
        return shapes

    def layer_outputs(self, module: nn.Module, kind: str, ins: List[torch.Tensor],
                      outs: List[torch.Tensor]) -> List[RawShape]:
        """Give a layer's outputs their states (see the module docstring); their raw shapes."""
        free = self._free_of(module)
        lead, lead_state = self._leading(module, free, kind, ins)
        shapes: List[RawShape] = []
        for i, out in enumerate(outs):
            state = None if free else known_batch_axis(module, i, out.dim(), True)
            if state is None:
                state = _inherit(lead, lead_state, out)
            self.set(out, state)
            if state is UNKNOWN:
                self._pending[id(out)] = (weakref.ref(out), shapes, len(shapes))
            shapes.append(_raw(tuple(out.shape), state))
        return shapes

    def _leading(self, module: nn.Module, free: bool, kind: str,
                 ins: List[torch.Tensor]) -> Tuple[Optional[torch.Tensor], State]:
        if kind == "rope" and len(ins) >= 2:
            ins = ins[1:2]  # rotary tables follow the position ids, not the hidden states
        states = []
        of = self.of
        for i, t in enumerate(ins):
            axis = None if free else known_batch_axis(module, i, t.dim(), False)
            state = of(t) if axis is None else axis
            if known(state):
                return t, state
            states.append(state)
        return None, combine(states) if states else NO_BATCH


def _inherit(lead: Optional[torch.Tensor], state: State, out: torch.Tensor) -> State:
    if lead is None or not known(state):
        return state
    axis = state.axis if isinstance(state, Merged) else state
    size = lead.shape[axis]
    for q in (axis, axis + out.dim() - lead.dim()):
        if 0 <= q < out.dim() and out.shape[q] == size:
            return Merged(q, state.extent) if isinstance(state, Merged) else q
    return UNKNOWN
