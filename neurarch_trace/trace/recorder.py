"""The recorder: forward hooks on every module, one :class:`~.records.LayerCall` per node.

A forward pre-hook/post-hook pair on every module records one node per call of a *layer*: a leaf
module, a module the mapping table knows as a whole (nn.MultiheadAttention, nn.LSTM), a TorchScript
submodule (opaque), or a container cut off by ``depth``. Work inside a layer is not looked into any
further; nn.Identity gets no node. Between layers, the flow mode (:mod:`.provenance`) calls
:meth:`Recorder.on_function`, which carries provenance and makes merge nodes (:mod:`.merges`). The
FLOP-counting dispatch mode (:class:`neurarch_trace.flops.FlopMode`) calls :meth:`Recorder.on_flops`,
which charges the innermost running layer, or the functional total when none runs.

:meth:`on_function` runs for every torch call between layers and looks up every operand's
provenance, :meth:`on_flops` for every aten call, the hooks for every module call: they read the
recorder's own state and methods bound once in ``__init__`` (``prov_of``, ``set_prov``), and add no
layer of calls per tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set

import torch
from torch import nn

from neurarch_trace.flops import flop_kind
from neurarch_trace.mapping import count_params, is_passthrough, is_whole_layer
from neurarch_trace.text import plural
from neurarch_trace.trace.batch import BatchAxes, BatchSize
from neurarch_trace.trace.kinds import LayerKinds, apply_node_formula
from neurarch_trace.trace.merges import MERGES, merge_operands, merge_record
from neurarch_trace.trace.modules import inner
from neurarch_trace.trace.ownership import Ownership, packed_param_count
from neurarch_trace.trace.provenance import EMPTY, FlowMode, Provenance
from neurarch_trace.trace.records import LayerCall, Recording
from neurarch_trace.trace.stack import LAYER, LayerStack, Names
from neurarch_trace.trace.tensors import dtype_name, iter_tensors, output_tensors, unique_tensors

__all__ = ["Recorder"]


class Recorder:
    """Records one forward pass of ``model`` (call :meth:`add_input` for each input tensor, run the
    forward under :attr:`flow` with the hooks installed, then :meth:`finish`).

    Args:
        model: the (unwrapped) model; its parameters and buffers get provenance keys.
        depth: stop descending at this depth (1 = the root's children); None descends to the leaves.
        batch_size: the first input's first dim, until a sequence-first layer says otherwise.
        root_name: the node name of the root when the root itself is a layer (the graph's name).
        samples: ids of the input tensors that are samples of a list of samples (no batch axis).

    State while the forward runs: ``inside_layer`` (> 0 while a layer's forward runs), ``paused``
    (True while the recorder's own bookkeeping runs tensor operations, which must fire no hook and
    count no FLOP), and the record FLOPs are charged to.
    """

    def __init__(self, model: nn.Module, *, depth: Optional[int], batch_size: int, root_name: str,
                 samples: frozenset = frozenset()) -> None:
        self.model = model
        self.depth = depth
        self.root_name = root_name
        self.records: List[LayerCall] = []
        self.inside_layer = 0
        self.paused = False
        self.functional_flops = 0
        self.functional_uncounted: Set[str] = set()
        self.flops_by_kind: Dict[str, int] = {}  # every counted FLOP of the pass, by operation kind
        self.scalars: List[Any] = []  # tensor values the forward read into Python (FlopMode fills it)
        self.batch = BatchSize(batch_size)
        self.axes = BatchAxes(self.batch)
        self._samples = samples
        self.stack = LayerStack(model)
        self.names = Names()
        self.provenance = Provenance(model)
        self.ownership = Ownership(self.provenance.tensors_by_key)
        self.kinds = LayerKinds(model)
        self.flow = FlowMode(self)
        self._sink: Optional[LayerCall] = None
        self._first_call: Dict[int, LayerCall] = {}
        self._qual_calls: Dict[str, int] = {}
        self._input_count = 0
        self.names.reserve("output")
        # bound once: the hot paths call these for every tensor
        self.prov_of = self.provenance.of
        self.set_prov = self.provenance.set

    # --- inputs and output ------------------------------------------------------------------
    def add_input(self, name: str, t: torch.Tensor) -> None:
        """Record a model input tensor (before the forward); ``name`` is made unique against the
        layer names in :meth:`finish`."""
        record = LayerCall(index=len(self.records), type="input", name=name)
        self.records.append(record)
        record.output_shapes = [self.axes.add_input(record, t, id(t) in self._samples)]
        record.output_dtype = record.traced_dtype = dtype_name(t.dtype)
        record.output_bytes = t.numel() * t.element_size()
        record.traced_shape = [int(d) for d in t.shape]
        self.set_prov(t, frozenset((record.index,)))
        self._input_count = len(self.records)

    def finish(self, output: Any) -> Recording:
        """Record the output node (fed by the producers of every tensor in ``output``), give the
        inputs their final names, and return the recording."""
        out_record = LayerCall(index=len(self.records), type="output", name="output")
        outs = output_tensors(output)
        for t in outs:
            prov = self.prov_of(t)
            out_record.add_sources(frozenset(k for k in prov if isinstance(k, int)))
            for key in prov:
                if isinstance(key, str) and out_record.sources:
                    # parameters reaching the output through functional code only: the last layer
                    # feeding the output owns them
                    self.ownership.claim_key(self.records[next(reversed(out_record.sources))], key)
        if outs:
            out_record.input_shape = self.axes.shape(outs[0])
            out_record.output_shapes = [self.axes.shape(t) for t in outs]
        self.records.append(out_record)
        for record in self.records[: self._input_count]:  # a layer keeps its module path; a clashing input is renamed
            record.name = self.names.unique(record.name if record.name not in self.names else f"input:{record.name}")
        return Recording(
            records=self.records,
            input_count=self._input_count,
            batch_size=self.batch.value,
            functional_flops=self.functional_flops,
            functional_uncounted=self.functional_uncounted,
            flops_by_kind=dict(sorted(self.flops_by_kind.items())),
            scalars=self.scalars,
        )

    def where(self) -> str:
        """How far the forward got, for an error: ``in layer 'fc' (Linear) after 3 layers``."""
        layers = len(self.records) - self._input_count
        running = self.stack.running_layer()
        if running is not None:
            cls = type(running.module).__name__ if running.module is not None else running.type
            return f"in layer {running.name!r} ({cls}) after {plural(layers - 1, 'layer')}"
        scope = self.stack.current_scope()
        if scope:
            return f"in {scope!r} after {plural(layers, 'layer')}"
        return f"after {plural(layers, 'layer')}"

    def running(self) -> str:
        """The layer or scope running now, for a warning: ``in layer 'fc' (Linear)``, ``in
        'encoder'``, or ``""`` at the top level."""
        layer = self.stack.running_layer()
        if layer is not None:
            cls = type(layer.module).__name__ if layer.module is not None else layer.type
            return f"in layer {layer.name!r} ({cls})"
        scope = self.stack.current_scope()
        return f"in {scope!r}" if scope else ""

    # --- the hooks --------------------------------------------------------------------------
    def _is_layer(self, module: nn.Module, qual: str) -> bool:
        if is_whole_layer(module) or not module._modules:
            return True
        if getattr(module, "_neurarch_opaque", False):
            return True
        if self.depth is not None:
            level = 0 if qual == "" else qual.count(".") + 1
            return level >= self.depth
        return False

    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook (``with_kwargs=True``) of every module."""
        if self.inside_layer or self.paused:  # inside a layer, or the recorder reading a parametrized weight
            self.stack.push_skip()
            return
        if is_passthrough(module) and module is not self.model:
            self.stack.push_skip()
            return
        qual = self.stack.qualname(module)
        if not self._is_layer(module, qual):
            self.stack.push_scope(qual, module)
            return
        self.paused = True
        try:
            record = self._new_layer(module, qual, args, kwargs)
        finally:
            self.paused = False
        self.stack.push_layer(record)
        self.inside_layer += 1
        self._sink = record
        self.flow.suspend()

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """Forward hook (``with_kwargs=True``) of every module."""
        kind, record = self.stack.pop()
        if kind is not LAYER:
            return
        self.flow.resume()
        self.inside_layer -= 1
        self._sink = None
        self.paused = True
        try:
            self._finish_layer(record, module, args, kwargs, output)
        finally:
            self.paused = False

    # --- layers -----------------------------------------------------------------------------
    def _new_layer(self, module: nn.Module, qual: str, args: tuple, kwargs: dict) -> LayerCall:
        record = LayerCall(index=len(self.records), type="customModule", module=module, qualname=qual)
        self.records.append(record)
        calls = self._qual_calls.get(qual, 0) + 1
        self._qual_calls[qual] = calls
        base = qual or self.root_name
        record.name = self.names.unique(base if calls == 1 else f"{base}#{calls}")
        record.scope = qual.rsplit(".", 1)[0] if "." in qual else None
        first = self._first_call.get(id(module))
        if first is None:
            self._first_call[id(module)] = record
        else:
            record.shared_with = first.index
        self.ownership.claim_module(record, module)
        record.packed_params = packed_param_count(module)
        param_count = record.own_params if first is None else count_params(module)
        self.kinds.assign(record, module, param_count + record.packed_params)
        for i, t in enumerate(list(iter_tensors(args)) + list(iter_tensors(kwargs))):
            prov = self.prov_of(t)
            self._take_sources(record, prov)
            if i == 0:
                if self.batch.learn(inner(module), t, prov, self.records):
                    self.axes.relearn(t, 1)
                record.input_shape = self.axes.layer_input(module, t)
        return record

    def _take_sources(self, record: LayerCall, prov: frozenset) -> None:
        if not prov:
            return
        for key in prov:
            if isinstance(key, str):
                self.ownership.claim_key(record, key)
        record.add_sources(frozenset(k for k in prov if isinstance(k, int)))

    def _finish_layer(self, record: LayerCall, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        outs = unique_tensors(output)
        key = frozenset((record.index,))
        ins = list(iter_tensors(args)) + list(iter_tensors(kwargs))
        record.output_shapes = self.axes.layer_outputs(module, record.type, ins, outs)
        for t in outs:
            record.output_bytes += t.numel() * t.element_size()
            self.set_prov(t, key)
        if outs:
            record.output_dtype = dtype_name(outs[0].dtype)
        apply_node_formula(record, module, args, outs)

    # --- functional code between layers, and FLOPs ------------------------------------------
    def on_function(self, func: Callable, args: tuple, kwargs: dict, out: Any) -> Any:
        """A torch function ran between layers: give its results the union of its operands'
        provenance, or make it a merge node."""
        ins = list(iter_tensors(args))
        if kwargs:
            ins.extend(iter_tensors({k: v for k, v in kwargs.items() if k != "out"}))
        name = getattr(func, "__name__", "")
        if not ins:
            self.axes.made(name, out)
            return out
        prov_of = self.prov_of
        provs = [prov_of(t) for t in ins]
        union = EMPTY.union(*provs)
        outputs = list(iter_tensors(out))
        if "out" in kwargs:
            outputs.extend(iter_tensors(kwargs["out"]))
        if out is None and name == "__setitem__" and ins:
            outputs.append(ins[0])
        self.paused = True  # a probe of the batch axis runs torch functions on meta tensors: no FLOPs
        try:
            self.axes.follow(func, name, args, kwargs, ins, outputs)
        finally:
            self.paused = False
        if not union:
            return out
        kind = MERGES.get(name)
        if kind is not None:
            operands = merge_operands(ins, provs)
            if operands is not None:
                union = frozenset((self._merge(kind, operands, out).index,))
        set_prov = self.set_prov
        for t in outputs:
            set_prov(t, union)
        return out

    def _merge(self, kind: str, operands: list, out: Any) -> LayerCall:
        record = merge_record(len(self.records), kind, self.stack.current_scope(), operands, out, self.axes)
        self.records.append(record)
        record.name = self.names.unique(record.qualname)
        for _, prov in operands:
            self._take_sources(record, prov)
        return record

    def on_flops(self, flops: Optional[int], op: str) -> None:
        """The FLOP sink of :class:`~neurarch_trace.flops.FlopMode`: ``flops`` of one aten call
        (None: it costs FLOPs no formula counts)."""
        if self.paused:
            return
        if flops:
            kind = flop_kind(op)
            self.flops_by_kind[kind] = self.flops_by_kind.get(kind, 0) + flops
        sink = self._sink
        if flops is None:
            (sink.uncounted if sink is not None else self.functional_uncounted).add(op)
        elif sink is not None:
            sink.flops += flops
        else:
            self.functional_flops += flops
