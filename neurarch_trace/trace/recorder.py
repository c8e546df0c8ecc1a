"""The recorder: a pre-hook and a post-hook around every module's forward, one
:class:`~.records.LayerCall` per node.

The pair (:meth:`Recorder.pre_hook`, :meth:`Recorder.post_hook`; run from a ``forward`` wrapper or
as forward hooks, see ``run._install_hooks``) on every module records one node per call of a *layer*: a leaf
module, a module the mapping table knows as a whole (nn.MultiheadAttention, nn.LSTM), a TorchScript
submodule (opaque), or a container cut off by ``depth``. Work inside a layer is not looked into any
further; nn.Identity gets no node. Between layers, the flow mode (:mod:`.provenance`) calls
:meth:`Recorder.on_function`, which carries provenance and makes merge nodes (:mod:`.merges`). The
FLOP-counting dispatch mode (:class:`neurarch_trace.flops.FlopMode`) calls :meth:`Recorder.on_flops`,
which charges the innermost running layer, or the functional total when none runs.

:meth:`on_function` runs for every torch call between layers and looks up every operand's
provenance, :meth:`on_flops` for every aten call, the hooks for every module call: they read the
recorder's own state and methods bound once in ``__init__`` (``prov_of``, ``set_prov``), and add no
layer of calls per tensor. The hooks run between a model's kernels, with the CPU caches cold: a
leaf layer called with one tensor (most calls) takes a path through each hook that does its work in
that hook's frame, and what a module's class or the tree decides is read before the forward (each
leaf's closed form) or kept per class (whether a class fixes a batch axis). The graphs are the same
on every path (``tests/test_closed_form.py`` compares them with the reference path's).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Set

import torch
import torch.nn.modules.module as _global_hooks
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.flops import NODE_FORMULA_OPS, FlopMode, flop_kind, same_dtype_operands
from neurarch_trace.mapping import count_params, is_passthrough, is_whole_layer, layer_spec
from neurarch_trace.text import plural
from neurarch_trace.trace.batch import BatchAxes, BatchSize
from neurarch_trace.trace.closed_form import ZERO_FLOP_FUNCTIONS, Formula, closed_form, formula_kind, module_formula
from neurarch_trace.trace.closed_form import enabled as fast_paths_enabled
from neurarch_trace.trace.kinds import LayerKinds, apply_node_formula, recurrent_flops
from neurarch_trace.trace.merges import MERGES, merge_operands, merge_record
from neurarch_trace.trace.modules import inner, is_recurrent
from neurarch_trace.trace.ownership import Ownership, packed_param_count
from neurarch_trace.trace.provenance import EMPTY, NO_TENSOR_RESULT, FlowMode, Provenance
from neurarch_trace.trace.records import LayerCall, Recording
from neurarch_trace.trace.stack import LAYER, SCOPE, LayerStack, Names
from neurarch_trace.trace.tensors import (
    arg_tensors,
    call_tensors,
    dtype_name,
    iter_tensors,
    output_tensors,
    unique_tensors,
)

__all__ = ["Recorder"]

# the mode stacks, read and changed around every layer call (FlowMode/FlopMode.suspend and resume)
_function_stack_len = torch._C._len_torch_function_stack
_function_mode_at = torch._C._get_function_stack_at
_pop_function_mode = torch._C._pop_torch_function_stack
_push_function_mode = torch._C._push_on_torch_function_stack
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_dispatch_mode_at = torch._C._get_dispatch_stack_at
_pop_dispatch_mode = torch._C._pop_torch_dispatch_stack
_push_dispatch_mode = torch._C._push_on_torch_dispatch_stack

#: Layers whose CPU and CUDA kernels refuse an input of another dtype than their weight
#: (``mat1 and mat2 must have the same dtype``), which the meta kernels let through.
_SAME_DTYPE = (nn.Linear, nn.Bilinear)
#: ``Recorder._running`` between layer calls.
_NOT_RUNNING = (None, None, [])
#: What the pre-hook needs of a module's class (:meth:`Recorder._class_kind`).
_SENSITIVE, _PASSTHROUGH, _RECURRENT, _PLAIN = "grad-sensitive", "passthrough", "recurrent", "plain"
#: The frame of a recurrent layer called inside a layer (see :meth:`Recorder._inner_recurrent`).
_INNER_RECURRENT = "inner recurrent"
#: Modules whose forward checks the grad mode (fused inference fast paths).
_GRAD_SENSITIVE = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


class Recorder:
    """Records one forward pass of ``model`` (call :meth:`add_input` for each input tensor, run the
    forward under :attr:`flow` with the hooks installed, then :meth:`finish`).

    Args:
        tree: the (unwrapped) model's module tree, walked before the forward (``walk.Tree``); its
            parameters and buffers get provenance keys.
        depth: stop descending at this depth (1 = the root's children); None descends to the leaves.
        batch_size: the first input's first dim, until a sequence-first layer says otherwise.
        root_name: the node name of the root when the root itself is a layer (the graph's name).
        samples: ids of the input tensors that are samples of a list of samples (no batch axis).

    State while the forward runs: ``inside_layer`` (> 0 while a layer's forward runs), ``paused``
    (True while the recorder's own bookkeeping runs tensor operations, which must fire no hook and
    count no FLOP), and the record FLOPs are charged to.
    """

    def __init__(self, tree: walk.Tree, *, depth: Optional[int], batch_size: int, root_name: str,
                 samples: frozenset = frozenset()) -> None:
        self.model = tree.model
        self.tree = tree  # walked before the forward (see walk.Tree)
        # on the meta device the recorder checks what its kernels do not (see _check_meta_dtype)
        self.on_meta = any([p.is_meta for _, p in tree.named_parameters])
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
        self.stack = LayerStack(tree)
        self.names = Names()
        self.provenance = Provenance(tree)
        self.ownership = Ownership(self.provenance.tensors_by_key)
        self.kinds = LayerKinds(tree)
        self.flow = FlowMode(self)
        self.flop_mode = FlopMode(self.on_flops, self.scalars)
        # closed-form FLOPs for known leaf layers (see .closed_form); a global forward hook would run
        # inside every layer, so it turns them off
        self.fast = fast_paths_enabled() and not (_global_hooks._global_forward_hooks
                                                  or _global_hooks._global_forward_pre_hooks)
        #: the forward runs without autograd (MultiheadAttention and TransformerEncoder with it),
        #: global hooks or not; only the reference path runs it all with autograd
        self.without_grad = fast_paths_enabled()
        self._closed: Optional[Formula] = None  # the running layer's closed form, if it has one
        # the running layer's (args, kwargs, their tensors), read in the pre-hook (layers do not nest)
        self._running: tuple = _NOT_RUNNING
        # torch functions the FLOP mode steps aside for between layers (none on the reference path)
        self.zero_flop_functions = ZERO_FLOP_FUNCTIONS if self.fast else frozenset()
        self._grad_modes: List[bool] = []  # grad modes to put back after grad-sensitive modules
        self._classes: Dict[type, str] = {}  # module class -> _SENSITIVE, _PASSTHROUGH or _PLAIN
        # id(module) -> closed_form.module_formula of every leaf module, read here before the forward,
        # in one warm loop (a hook runs cold, see _settle); closed_form reads any other layer's itself
        self._module_formulas: Dict[int, Optional[Formula]] = {}
        if self.fast:
            self._module_formulas = {id(m): module_formula(m) for m in tree.modules if not m._modules}
        # id(module) -> the forward wrapper the recorder runs in (see traced_forward)
        self._traced: Dict[int, Callable[..., Any]] = {}
        self._whole_types: Dict[type, bool] = {}
        self._rope_types: Dict[type, bool] = {}
        self._sink: Optional[LayerCall] = None
        # layer calls and merges to settle after the forward, in call order (see _settle)
        self._pending: List[tuple] = []
        self._settled = 0
        self._closed_flops: Dict[int, tuple] = {}  # record index -> (formula, input shape, output shape)
        self._first_call: Dict[int, LayerCall] = {}
        # record index -> the modules called inside that layer (a node a depth cuts calling a module
        # from elsewhere in the tree): the layer owns what they use and nobody owned before
        self._inner_modules: Dict[int, List[nn.Module]] = {}
        self._qual_calls: Dict[str, int] = {}
        self._input_count = 0
        self.names.reserve("output")
        # bound once: the hot paths call these for every tensor
        self.prov_of = self.provenance.of
        self.set_prov = self.provenance.set
        # the layer stack's, for the hooks' paths that push and pop its frames themselves
        self._push_frame = self.stack.frames.append
        self._pop_frame = self.stack.frames.pop
        self._pop_scope = self.stack.scopes.pop

    def traced_forward(self, module: nn.Module, traced: Callable[..., Any]) -> None:
        """``module``'s ``forward`` is ``traced``, an instance attribute that calls :meth:`pre_hook`
        and :meth:`post_hook` around the class's forward, in place of the two hooks (the
        installer's, ``run._install_hooks``): what :func:`.closed_form.closed_form` expects of it."""
        self._traced[id(module)] = traced

    # --- inputs and output ------------------------------------------------------------------
    def adopt_batch(self, batch_size: int, fed_shape: tuple) -> None:
        """After :meth:`add_input`: the batch size another trace of the same call learned from a
        sequence-first layer fed a tensor of ``fed_shape`` (batch on axis 1), which this trace's
        depth cuts off (:meth:`.batch.BatchSize.adopt`)."""
        self.batch.adopt(batch_size, fed_shape)
        self.axes.reread_inputs(fed_shape, 1)

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
        self.on_meta = self.on_meta or t.is_meta
        if self.on_meta:  # the meta kernels of matrix products do not check dtypes
            self.flop_mode.check = same_dtype_operands

    def finish(self, output: Any) -> Recording:
        """Record the output node (fed by the producers of every tensor in ``output``), give the
        inputs their final names, and return the recording."""
        self._settle()
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
            fed_shape=self.batch.fed_shape,
            on_meta=self.on_meta,
        )

    def close(self) -> None:
        """Drop the references back to this recorder once its recording is made (:meth:`finish`):
        its two modes' (the flow mode's recorder, the FLOP mode's sink) and the forward wrappers'
        (:meth:`traced_forward`). Reference counting then frees the recorder and what only it holds
        as soon as the trace lets go of it; left as cycles, they waited for the cyclic garbage
        collector, whose pass over them (about 17 objects a layer call) cost a trace of a
        1,000-layer chain 6 to 10 ms. The recorder records nothing more after this."""
        self._traced.clear()
        self.flow._recorder = None
        self.flop_mode._sink = None

    def where(self) -> str:
        """How far the forward got, for an error: ``in layer 'fc' (Linear) after 3 layers``."""
        self._settle()
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
        self._settle()  # the running layer's name
        layer = self.stack.running_layer()
        if layer is not None:
            cls = type(layer.module).__name__ if layer.module is not None else layer.type
            return f"in layer {layer.name!r} ({cls})"
        scope = self.stack.current_scope()
        return f"in {scope!r}" if scope else ""

    # --- the hooks --------------------------------------------------------------------------
    def _is_layer(self, module: nn.Module, qual: str) -> bool:
        if not module._modules:
            return True
        whole = self._whole_types.get(type(module))
        if whole is None:  # the mapping's answer depends on the class alone
            whole = self._whole_types[type(module)] = is_whole_layer(module)
        if whole:
            return True
        if getattr(type(module), "_neurarch_opaque", False):
            return True
        if self.depth is not None:
            level = 0 if qual == "" else qual.count(".") + 1
            return level >= self.depth
        return False

    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook (``with_kwargs=True``) of every module.

        A layer's bookkeeping runs with the flow mode and the FLOP mode off their stacks; the FLOP
        mode goes back for the layer's forward unless the layer's FLOPs have a closed form
        (:mod:`.closed_form`), which :meth:`post_hook` charges instead."""
        cls = type(module)
        kind = self._classes.get(cls)
        if kind is None:
            kind = self._classes[cls] = self._class_kind(cls, module)
        if kind is _SENSITIVE and not torch.is_inference_mode_enabled():
            self._grad_modes.append(torch.is_grad_enabled())
            torch._C._set_grad_enabled(True)
        if self.inside_layer or self.paused:  # inside a layer, or the recorder reading a parametrized weight
            self._call_inside_layer(module, kind)
            return
        if kind is _PASSTHROUGH and module is not self.model:
            self.stack.push_skip()
            return
        if kind is _PLAIN and not module._modules and not kwargs and len(args) == 1 and \
                type(args[0]) is torch.Tensor and self.fast:
            # a leaf layer called with one plain tensor (most calls of most models): what _new_layer
            # and the modes' suspend do below, in this one frame. A hook runs between kernels that
            # have pushed its code and data out of the CPU caches, and each Python call it makes
            # costs a few cache misses more.
            x = args[0]
            qual = self.stack.qualname(module)
            flow, flop_mode = self.flow, self.flop_mode
            depth = _function_stack_len()  # FlowMode.suspend
            flow._popped.append(_pop_function_mode() if depth and _function_mode_at(depth - 1) is flow else None)
            depth = _dispatch_stack_len()  # FlopMode.suspend
            popped = depth > 0 and _dispatch_mode_at(depth - 1) is flop_mode
            if popped:
                _pop_dispatch_mode(None)
            flop_mode._popped.append(popped)
            if self.on_meta:  # as _new_layer: raised with the modes popped, which _forward puts back
                _check_meta_dtype(module, qual or self.root_name, x)
            records = self.records
            record = LayerCall(len(records), "customModule", "", module, qual)
            records.append(record)
            tensors = [x]
            self._running = (args, kwargs, tensors)
            prov = self.prov_of(x)
            record.input_shape = self.axes.leaf_input(module, x, prov, records)
            self._pending.append((record, [prov]))
            self._push_frame((LAYER, record))
            self.inside_layer += 1
            self._sink = record
            formula = self._closed = closed_form(module, args, kwargs, self._module_formulas.get(id(module), False),
                                                 self._traced.get(id(module))) if popped else None
            if formula is None:
                flop_mode.resume()
            return
        qual = self.stack.qualname(module)
        if not self._is_layer(module, qual):
            self.stack.push_scope(qual, module)
            return
        self.flow.suspend()
        popped = self.flop_mode.suspend()
        self.paused = True
        try:
            record = self._new_layer(module, qual, args, kwargs)
        finally:
            self.paused = False
        self.stack.push_layer(record)
        self.inside_layer += 1
        self._sink = record
        # a closed form only when the FLOP mode really is off the stack (no other mode above it)
        formula = None
        if self.fast and popped:
            formula = closed_form(module, args, kwargs, self._module_formulas.get(id(module), False),
                                  self._traced.get(id(module)))
        self._closed = formula
        if formula is None:
            self.flop_mode.resume()

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """Forward hook (``with_kwargs=True``) of every module."""
        kind, record = self._pop_frame()  # LayerStack.pop
        if kind is SCOPE:
            self._pop_scope()
        elif kind is _INNER_RECURRENT:
            self._inner_recurrent(module, args, *record)
        elif kind is LAYER:
            self.inside_layer -= 1
            self._sink = None
            formula = self._closed
            self._closed = None
            flop_mode = self.flop_mode
            if formula is None:
                flop_mode.suspend()
            seen_args, seen_kwargs, ins = self._running
            self.paused = True
            try:
                if type(output) is torch.Tensor and len(ins) == 1 and args is seen_args and kwargs is seen_kwargs:
                    # one tensor in, one out (most layer calls): _finish_layer's work in this frame
                    # (see the leaf path of pre_hook)
                    self._running = _NOT_RUNNING
                    x = ins[0]
                    shapes = record.output_shapes = self.axes.leaf_output(module, x, output)
                    dtype = record.output_dtype = output.dtype  # its name in _settle
                    out_shape = shapes[0][0]
                    record.output_bytes += math.prod(out_shape) * dtype.itemsize  # numel() * element_size()
                    self.set_prov(output, frozenset((record.index,)))
                    if formula is not None:
                        self._closed_flops[record.index] = (formula, x.shape, out_shape)
                    else:
                        self._node_formula(record, module, args, [output])
                else:
                    self._finish_layer(record, module, args, kwargs, output, formula)
            finally:
                self.paused = False
            if flop_mode._popped and flop_mode._popped.pop():  # FlopMode.resume
                _push_dispatch_mode(flop_mode)
            popped = self.flow._popped.pop() if self.flow._popped else None  # FlowMode.resume
            if popped is not None:
                _push_function_mode(popped)
        if self._grad_modes and self._classes.get(type(module)) is _SENSITIVE and not torch.is_inference_mode_enabled():
            torch._C._set_grad_enabled(self._grad_modes.pop())

    def _call_inside_layer(self, module: nn.Module, kind: str) -> None:
        """The pre-hook of a module called inside a layer: a frame for it; a recurrent one's FLOPs
        are put right after it (:meth:`_inner_recurrent`), and the running layer owns the weights
        it uses that nobody owned before (a node a depth cuts calling a module from elsewhere)."""
        sink = self._sink
        if sink is None or self.paused:  # the recorder reading a parametrized weight
            self.stack.push_skip()
            return
        self._inner_modules.setdefault(sink.index, []).append(module)
        if kind is _RECURRENT:
            self._push_frame((_INNER_RECURRENT, (sink, sink.flops, self.flops_by_kind.get("matmul", 0),
                                                 frozenset(sink.uncounted))))
        else:
            self.stack.push_skip()

    def _inner_recurrent(self, module: nn.Module, args: tuple, sink: LayerCall, flops_before: int,
                         matmul_before: int, uncounted_before: frozenset) -> None:
        """An nn.LSTM/GRU/RNN ran inside the layer ``sink`` (a node a depth cuts, or a container
        the mapping takes whole): its FLOPs by the recurrent layer's node formula, as a full-depth
        trace counts them, in place of what the dispatch mode counted of its ops (the CPU's
        ``aten.mkldnn_rnn_layer`` has no formula). ``*_before``: the sink's FLOPs, the pass's
        matrix-product FLOPs and the sink's uncounted ops when the recurrent call began."""
        flops = recurrent_flops(inner(module), args)
        if flops is None:  # an input the formula does not read
            return
        sink.flops = flops_before + flops
        # the ops of this call without a formula are the ones the node formula stands for
        sink.uncounted = set(uncounted_before) | {op for op in sink.uncounted if op not in NODE_FORMULA_OPS}
        if self.flops_by_kind.get("matmul", 0) != matmul_before + flops:
            self.flops_by_kind["matmul"] = matmul_before + flops

    def _axes_kind(self, module: nn.Module, ins: list) -> str:
        """The layer's type as far as the batch axes need it before :meth:`_settle` types it:
        ``rope`` (whose outputs follow its second input, the position ids), else ``customModule``."""
        if len(ins) < 2 or module._modules:
            return "customModule"
        cls = type(module)
        rope = self._rope_types.get(cls)
        if rope is None:
            rope = self._rope_types[cls] = layer_spec(inner(module), param_count=0)[0] == "rope"
        return "rope" if rope else "customModule"

    def _class_kind(self, cls: type, module: nn.Module) -> str:
        """What the pre-hook needs of a module's class: :data:`_SENSITIVE` for nn.MultiheadAttention
        and nn.TransformerEncoder(Layer), which take a fused fast path when autograd is off (on the
        fast path, a forward under ``no_grad``, they run with autograd on, as on the reference
        path, unless the model itself runs them under ``inference_mode``); :data:`_PASSTHROUGH`
        for a module that gets no node (nn.Identity); :data:`_RECURRENT` for nn.LSTM/GRU/RNN (see
        :meth:`_inner_recurrent`); else :data:`_PLAIN`."""
        if self.without_grad and issubclass(cls, _GRAD_SENSITIVE):
            return _SENSITIVE
        if is_recurrent(module):
            return _RECURRENT
        return _PASSTHROUGH if is_passthrough(module) else _PLAIN

    # --- layers -----------------------------------------------------------------------------
    def _new_layer(self, module: nn.Module, qual: str, args: tuple, kwargs: dict) -> LayerCall:
        """The record of a layer call, with what must be read while the call runs (its inputs'
        provenance and shapes); :meth:`_settle` does the rest after the forward."""
        tensors = call_tensors(args, kwargs)
        self._running = (args, kwargs, tensors)  # the post-hook's, unless another pre-hook replaced them
        if tensors and self.on_meta:
            _check_meta_dtype(module, qual or self.root_name, tensors[0])
        record = LayerCall(index=len(self.records), type="customModule", module=module, qualname=qual)
        self.records.append(record)
        provs = [self.prov_of(t) for t in tensors]
        if tensors:
            if self.batch.learn(module, tensors[0], provs[0], self.records):
                self.axes.relearn(tensors[0], 1)
            record.input_shape = self.axes.layer_input(module, tensors[0])
        self._pending.append((record, provs))
        return record

    def _settle(self) -> None:
        """Everything about the recorded layer calls and merges that need not be read while they
        run, in call order (names, scopes, shared calls, parameter ownership, types and params,
        sources, closed-form FLOPs, dtype names). Done after the forward, in one tight loop: a
        hook runs between a model's kernels, whose data has pushed the recorder's code and data
        out of the CPU caches, so every line a hook does not run is several times cheaper here."""
        self.paused = True  # reading a parametrized weight calls modules, whose hooks must do nothing
        try:
            for record, provs in self._pending[self._settled:]:
                if record.module is not None:
                    self._settle_layer(record)
                else:  # a merge: named in call order with the layers, same for its sources
                    record.name = self.names.unique(record.qualname)
                for prov in provs:
                    self._take_sources(record, prov)
                if isinstance(record.output_dtype, torch.dtype):
                    record.output_dtype = dtype_name(record.output_dtype)
            self._settled = len(self._pending)
        finally:
            self.paused = False

    def _settle_layer(self, record: LayerCall) -> None:
        module, qual = record.module, record.qualname
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
        for called in self._inner_modules.pop(record.index, ()):
            self.ownership.claim_module(record, called)
        record.packed_params = packed_param_count(module)
        param_count = record.own_params if first is None else count_params(module)
        self.kinds.assign(record, module, param_count + record.packed_params)
        closed = self._closed_flops.pop(record.index, None)
        if closed is not None:
            formula, x_shape, out_shape = closed
            flops = formula(module, x_shape, out_shape)
            if flops:
                record.flops += flops
                kind = formula_kind(formula)
                self.flops_by_kind[kind] = self.flops_by_kind.get(kind, 0) + flops

    def _take_sources(self, record: LayerCall, prov: frozenset) -> None:
        if not prov:
            return
        names = [key for key in prov if isinstance(key, str)]
        if not names:  # the common case: only records
            record.add_sources(prov)
            return
        for key in names:
            self.ownership.claim_key(record, key)
        record.add_sources(frozenset(k for k in prov if isinstance(k, int)))

    def _finish_layer(self, record: LayerCall, module: nn.Module, args: tuple, kwargs: dict, output: Any,
                      formula: Optional[Formula]) -> None:
        outs = unique_tensors(output)
        key = frozenset((record.index,))
        seen_args, seen_kwargs, ins = self._running
        self._running = _NOT_RUNNING
        if args is not seen_args or kwargs is not seen_kwargs:
            ins = call_tensors(args, kwargs)
        record.output_shapes = self.axes.layer_outputs(module, self._axes_kind(module, ins), ins, outs)
        set_prov = self.set_prov
        for t in outs:
            record.output_bytes += t.numel() * t.element_size()
            set_prov(t, key)
        if outs:
            record.output_dtype = outs[0].dtype  # its name in _settle
        if formula is not None:  # a closed form reads the first positional tensor (closed_form's)
            self._closed_flops[record.index] = (formula, ins[0].shape, outs[0].shape if outs else None)
        else:
            self._node_formula(record, module, args, outs)

    def _node_formula(self, record: LayerCall, module: nn.Module, args: tuple, outs: list) -> None:
        before = record.flops
        apply_node_formula(record, module, args, outs)
        if record.flops != before:  # a node formula (recurrent layers, packed linears): matrix products
            self.flops_by_kind["matmul"] = self.flops_by_kind.get("matmul", 0) + record.flops - before

    # --- functional code between layers, and FLOPs ------------------------------------------
    def on_function(self, func: Callable, args: tuple, kwargs: dict, out: Any) -> Any:
        """A torch function ran between layers: give its results the union of its operands'
        provenance, or make it a merge node."""
        if type(out) in NO_TENSOR_RESULT and "out" not in kwargs:
            return out  # x.shape, x.size(-1), x.dim(), x.dtype: nothing to carry provenance to
        ins = arg_tensors(args)
        if kwargs:
            ins.extend(arg_tensors([v for k, v in kwargs.items() if k != "out"]))  # iter_tensors' order
        name = getattr(func, "__name__", "")
        if not ins:
            self.axes.made(name, out)
            return out
        prov_of = self.prov_of
        provs = [prov_of(t) for t in ins]
        union = provs[0] if len(provs) == 1 else EMPTY.union(*provs)
        outputs = [out] if isinstance(out, torch.Tensor) else list(iter_tensors(out))
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
        self._pending.append((record, [prov for _, prov in operands]))  # named and sourced in _settle
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
            if sink is None:
                self.functional_uncounted.add(op)
            else:
                if type(sink.uncounted) is frozenset:  # the record's first (see LayerCall)
                    sink.uncounted = set()
                sink.uncounted.add(op)
        elif sink is not None:
            sink.flops += flops
        else:
            self.functional_flops += flops


def _check_meta_dtype(module: nn.Module, name: str, x: torch.Tensor) -> None:
    """Raise what the CPU would: an ``nn.Linear`` given an input of another dtype than its weight
    (an ``int64`` token tensor, ``float16`` into ``float32`` weights) outside autocast. The meta
    kernel computes a result; the trace would describe a model that cannot run. (The message
    avoids the word "meta": it is the user's error, not a value the meta device lacks.)"""
    if not isinstance(module, _SAME_DTYPE):
        return
    weight = module._parameters.get("weight")
    if weight is None or weight.dtype == x.dtype or any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
        return
    raise RuntimeError(f"layer {name!r} ({type(module).__name__}) got an input of dtype {dtype_name(x.dtype)} for its "
                       f"{dtype_name(weight.dtype)} weights, which PyTorch's CPU and CUDA kernels refuse")
