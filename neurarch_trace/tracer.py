"""Trace one forward pass of a PyTorch model into a ``.neurarch.json`` graph.

How it works
------------
* **Nodes.** A forward pre-hook/post-hook pair on every module records one node per call of a
  *layer*: a leaf module, a module the mapping table knows as a whole (nn.MultiheadAttention,
  nn.LSTM), a TorchScript submodule (opaque), or a container cut off by ``depth``. Work inside a
  layer is not looked into any further. nn.Identity gets no node.
* **Edges.** Every tensor carries its *provenance*: the set of nodes (and directly-read parameters)
  its value was computed from without passing through another layer. A layer's output gets
  ``{that layer}``; functional code between layers (``x + residual``, ``torch.cat``, reshapes,
  attention matmuls, RoPE arithmetic) runs under a ``TorchFunctionMode`` that gives each result the
  union of its operands' provenance, whatever the grad mode (so ``torch.no_grad()`` and
  ``torch.inference_mode()`` regions and integer paths are followed too). A layer's incoming edges
  are the provenance of its inputs. An add/sub, a concatenation or a stack whose operands come from
  different producers becomes an ``add``, ``concatenate`` or ``stack`` node (in-place ``+=`` too).
* **Statistics.** A ``TorchDispatchMode`` counts each aten operation's FLOPs with
  ``torch.utils.flop_counter``'s formulas (plus :mod:`neurarch_trace.flops`) and charges them to the
  innermost running layer, or to the functional total when no layer runs. Parameters are owned by
  the first call that uses them (tied weights and shared modules count once).

The forward runs once, in ``eval()`` mode with autograd enabled; the model's training flags are
restored and every hook removed in a ``finally`` block.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import weakref
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from neurarch_trace._version import __version__
from neurarch_trace.errors import TraceError
from neurarch_trace.flops import NODE_FORMULA_OPS, FlopMode, flop_kind, linear_flops, rnn_flops
from neurarch_trace.graph import layout
from neurarch_trace.mapping import container_spec, count_params, is_passthrough, is_whole_layer, layer_spec
from neurarch_trace.rehearsal import rehearse_training_step

__all__ = ["trace_model", "unwrap_model", "dtype_name"]

_EMPTY: frozenset = frozenset()

_MERGES: dict[str, str] = {
    **{name: "add" for name in ("add", "add_", "__add__", "__radd__", "__iadd__",
                                "sub", "sub_", "__sub__", "__rsub__", "__isub__", "subtract")},
    **{name: "concatenate" for name in ("cat", "concat", "concatenate", "hstack", "vstack",
                                        "dstack", "column_stack", "row_stack")},
    "stack": "stack",
}
_MERGE_BASENAME = {"add": "add", "concatenate": "cat", "stack": "stack"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).replace("torch.", "")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside ``torch.compile``, nn.DataParallel and DistributedDataParallel wrappers,
    so that names and scopes carry no ``_orig_mod.``/``module.`` prefix. The compiled wrapper is
    never run: tracing is eager."""
    seen = 0
    while seen < 16:
        seen += 1
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
            continue
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
            continue
        break
    return model


def _iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj``: tensors, lists, tuples (named ones too), dicts (and
    transformers' ``ModelOutput``), dataclasses; in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth > 8 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, Mapping):
        for value in obj.values():
            yield from _iter_tensors(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _iter_tensors(value, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from _iter_tensors(getattr(obj, field.name, None), depth + 1)


@dataclasses.dataclass
class _Node:
    index: int
    type: str
    name: str = ""
    params: dict = dataclasses.field(default_factory=dict)
    scope: str | None = None
    sources: dict = dataclasses.field(default_factory=dict)  # ordered unique provenance keys (values unused)
    input_shape: list | None = None
    output_shapes: list = dataclasses.field(default_factory=list)
    output_dtype: str | None = None
    output_bytes: int = 0
    own_params: int = 0
    own_buffers: int = 0
    packed_params: int = 0
    shared_with: int | None = None
    flops: int = 0
    uncounted: set = dataclasses.field(default_factory=set)
    module: nn.Module | None = None
    qualname: str = ""
    extra: dict = dataclasses.field(default_factory=dict)

    def add_sources(self, keys: frozenset) -> None:
        for key in sorted(keys, key=_key_order):
            self.sources.setdefault(key, None)


def _key_order(key: Any) -> tuple:
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


class _FlowMode(TorchFunctionMode):
    """Propagates provenance through functional code between layers and makes merge nodes."""

    def __init__(self, tracer: "_Tracer") -> None:
        super().__init__()
        self._tracer = tracer

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tracer = self._tracer
        if tracer.inside_layer or tracer.paused:
            return out
        return tracer.on_function(func, args, kwargs, out)


class _Tracer:
    def __init__(self, model: nn.Module, *, depth: int | None, batch_size: int) -> None:
        self.model = model
        self.depth = depth
        self.batch_size = batch_size
        self.nodes: list[_Node] = []
        self.inside_layer = 0  # > 0 while a layer's forward runs
        self.paused = False  # True while the tracer's own bookkeeping runs tensor operations
        self._batch_learned = False
        self.flow_mode: _FlowMode | None = None
        self._popped: list = []
        self._stack: list[tuple[str, Any]] = []  # ("scope", qualname) | ("layer", node) | ("skip", None)
        self._prov: dict[int, tuple[weakref.ref, frozenset]] = {}
        self._sink: _Node | None = None
        self.functional_flops = 0
        self.flops_by_kind: dict[str, int] = {}  # forward FLOPs by operation kind, whole model
        self.scalars: list = []  # tensor values the forward read into Python, in order
        self.functional_uncounted: set[str] = set()
        self._names: set[str] = set()
        self._name_next: dict[str, int] = {}
        self._merge_counts: dict[str, int] = {}
        self._first_call: dict[int, _Node] = {}
        self._qual_calls: dict[str, int] = {}
        # parameters and buffers: id -> (provenance key, tensor)
        self._tensors: dict[int, tuple[str, torch.Tensor]] = {}
        self._owner: dict[int, int] = {}
        for name, p in model.named_parameters(remove_duplicate=True):
            self._tensors[id(p)] = (f"param:{name}", p)
        for name, b in model.named_buffers(remove_duplicate=True):
            self._tensors.setdefault(id(b), (f"buffer:{name}", b))
        self._key_tensor = {key: t for key, t in self._tensors.values()}
        self._child_names: dict[int, dict[int, str]] = {}
        self._default_qual: dict[int, str] = {}
        for qual, mod in model.named_modules(remove_duplicate=False):
            self._default_qual.setdefault(id(mod), qual)
            self._child_names[id(mod)] = {id(c): n for n, c in mod._modules.items() if c is not None}
        self._embedding_weights = {
            id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)
        }
        out_emb = None
        get_out = getattr(model, "get_output_embeddings", None)
        if callable(get_out):
            try:
                out_emb = get_out()
            except Exception:  # noqa: BLE001 - a model's own accessor may not apply
                out_emb = None
        self._output_embeddings = out_emb if isinstance(out_emb, nn.Module) else None

    # --- provenance -----------------------------------------------------------------------
    def prov_of(self, t: torch.Tensor) -> frozenset:
        entry = self._prov.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        known = self._tensors.get(id(t))
        if known is not None and known[1] is t:
            return frozenset((known[0],))
        return _EMPTY

    def set_prov(self, t: torch.Tensor, prov: frozenset) -> None:
        key = id(t)
        entries = self._prov

        def _drop(ref: weakref.ref, key: int = key) -> None:
            current = entries.get(key)
            if current is not None and current[0] is ref:
                del entries[key]

        try:
            entries[key] = (weakref.ref(t, _drop), prov)
        except TypeError:  # pragma: no cover - tensors always support weak references
            pass

    # --- the flow mode is off inside a layer ----------------------------------------------------
    # Work inside a layer is not looked into, and a TorchFunctionMode costs every torch call a trip
    # through Python: popping it off the stack for the layer's forward keeps the trace near the
    # speed of the bare forward. Only our own mode is popped (when it is on top); hooks nest, so
    # the pushes and pops pair up, and trace_model puts back whatever an exception left popped.
    def _suspend_flow(self) -> None:
        popped = None
        if self.flow_mode is not None and torch._C._len_torch_function_stack() > 0:
            top = torch._C._get_function_stack_at(torch._C._len_torch_function_stack() - 1)
            if top is self.flow_mode:
                popped = torch._C._pop_torch_function_stack()
        self._popped.append(popped)

    def _resume_flow(self) -> None:
        popped = self._popped.pop() if self._popped else None
        if popped is not None:
            torch._C._push_on_torch_function_stack(popped)

    def restore_flow(self) -> None:
        while self._popped:
            self._resume_flow()

    # --- naming ---------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """``base``, or ``base#2``, ``base#3``, ... (a counter per base keeps this O(1))."""
        name = base
        n = self._name_next.get(base, 1)
        while name in self._names:
            n += 1
            name = f"{base}#{n}"
        self._name_next[base] = n
        self._names.add(name)
        return name

    def _current_scope(self) -> str:
        for kind, value in reversed(self._stack):
            if kind == "scope":
                return value
        return ""

    def _qualname(self, module: nn.Module) -> str:
        if module is self.model:
            return ""
        parent_qual = None
        for kind, value in reversed(self._stack):
            if kind == "scope":
                parent_qual = value
                break
        if parent_qual is not None:
            parent = self._scope_modules[-1]
            child = self._child_names.get(id(parent), {}).get(id(module))
            if child is not None:
                return f"{parent_qual}.{child}" if parent_qual else child
        return self._default_qual.get(id(module), type(module).__name__)

    # --- layers -----------------------------------------------------------------------------
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
        if self.inside_layer or self.paused:  # inside a layer, or the tracer reading a parametrized weight
            self._stack.append(("skip", None))
            return
        if is_passthrough(module) and module is not self.model:
            self._stack.append(("skip", None))
            return
        qual = self._qualname(module)
        if not self._is_layer(module, qual):
            self._stack.append(("scope", qual))
            self._scope_modules.append(module)
            return
        self.paused = True
        try:
            node = self._new_layer(module, qual, args, kwargs)
        finally:
            self.paused = False
        self._stack.append(("layer", node))
        self.inside_layer += 1
        self._sink = node
        self._suspend_flow()

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        kind, value = self._stack.pop()
        if kind == "skip":
            return
        if kind == "scope":
            self._scope_modules.pop()
            return
        node: _Node = value
        self._resume_flow()
        self.inside_layer -= 1
        self._sink = None
        self.paused = True
        try:
            self._finish_layer(node, module, args, kwargs, output)
        finally:
            self.paused = False

    def _new_layer(self, module: nn.Module, qual: str, args: tuple, kwargs: dict) -> _Node:
        node = _Node(index=len(self.nodes), type="customModule", module=module, qualname=qual)
        self.nodes.append(node)
        calls = self._qual_calls.get(qual, 0) + 1
        self._qual_calls[qual] = calls
        base = qual or self.root_name
        node.name = self.unique_name(base if calls == 1 else f"{base}#{calls}")
        node.scope = qual.rsplit(".", 1)[0] if "." in qual else None
        first = self._first_call.get(id(module))
        if first is None:
            self._first_call[id(module)] = node
        else:
            node.shared_with = first.index
        # parameters and buffers this call owns (a leaf's own dicts are enough, and much cheaper)
        leaf = not module._modules
        params = module._parameters.values() if leaf else module.parameters()
        buffers = module._buffers.values() if leaf else module.buffers()
        for p in params:
            if p is not None and id(p) not in self._owner:
                self._owner[id(p)] = node.index
                node.own_params += p.numel()
        for b in buffers:
            if b is not None and id(b) not in self._owner:
                self._owner[id(b)] = node.index
                node.own_buffers += b.numel()
        node.packed_params = _packed_param_count(module)
        param_count = node.own_params if first is None else count_params(module)
        if getattr(module, "_neurarch_opaque", False):
            inner = module._neurarch_inner
            class_name = getattr(inner, "original_name", None) or type(inner).__name__
            node.type, node.params = "customModule", {"className": class_name, "paramCount": param_count}
        elif module._modules and not is_whole_layer(module):
            node.type, node.params = container_spec(module, param_count=param_count + node.packed_params)
        else:
            target = getattr(module, "_neurarch_inner", module)
            node.type, node.params = layer_spec(target, param_count=param_count + node.packed_params)
        if node.type == "linear":
            self._maybe_lm_head(node, module)
        tensors = list(_iter_tensors(args)) + list(_iter_tensors(kwargs))
        for i, t in enumerate(tensors):
            prov = self.prov_of(t)
            self._take_sources(node, prov)
            if i == 0:
                node.input_shape = self.batchless(t, module, 0, is_output=False)
                self.learn_batch(getattr(module, "_neurarch_inner", module), t, prov)
        return node

    def _maybe_lm_head(self, node: _Node, module: nn.Module) -> None:
        weight = getattr(module, "weight", None)
        tied = isinstance(weight, torch.Tensor) and id(weight) in self._embedding_weights
        if tied or (self._output_embeddings is not None and module is self._output_embeddings):
            p = node.params
            node.type = "lmHead"
            node.params = {
                "embedDim": p["inFeatures"],
                "vocabSize": p["outFeatures"],
                "bias": p.get("bias", True),
                "weightTied": bool(tied),
            }

    def _take_sources(self, node: _Node, prov: frozenset) -> None:
        if not prov:
            return
        for key in prov:
            if isinstance(key, str):
                self._own_key(node, key)
        node.add_sources(frozenset(k for k in prov if isinstance(k, int)))

    def _own_key(self, node: _Node, key: str) -> None:
        t = self._key_tensor.get(key)
        if t is None or id(t) in self._owner:
            return
        self._owner[id(t)] = node.index
        if key.startswith("param:"):
            node.own_params += t.numel()
        else:
            node.own_buffers += t.numel()

    def _finish_layer(self, node: _Node, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        outs = list(_iter_tensors(output))
        key = frozenset((node.index,))
        for i, t in enumerate(outs):
            node.output_shapes.append(self.batchless(t, module, i, is_output=True))
            node.output_bytes += t.numel() * t.element_size()
            self.set_prov(t, key)
        if outs:
            node.output_dtype = dtype_name(outs[0].dtype)
        self._node_formula(node, module, args, kwargs, outs)

    def _node_formula(self, node: _Node, module: nn.Module, args: tuple, kwargs: dict, outs: list) -> None:
        """Replace the dispatch count where the CPU kernels have no formula (see flops.py)."""
        target = getattr(module, "_neurarch_inner", module)
        covered = {op for op in node.uncounted if op in NODE_FORMULA_OPS}
        if _is_recurrent(target):
            x = next(_iter_tensors(args), None)
            if x is not None and x.dim() >= 2:
                if x.dim() == 3:
                    seq, batch = (x.shape[1], x.shape[0]) if target.batch_first else (x.shape[0], x.shape[1])
                else:  # unbatched (L, H_in)
                    seq, batch = x.shape[0], 1
                node.flops = rnn_flops(target, int(seq), int(batch))
                node.uncounted -= covered
        elif covered and hasattr(target, "weight") and callable(target.weight) and outs:
            w = target.weight()
            out_features, in_features = int(w.shape[0]), int(w.shape[1])
            rows = outs[0].numel() // out_features
            node.flops += linear_flops(in_features, out_features, rows)
            node.uncounted -= covered

    # --- merges and functional code -------------------------------------------------------
    def on_function(self, func: Callable, args: tuple, kwargs: dict, out: Any) -> Any:
        ins = list(_iter_tensors(args))
        if kwargs:
            ins.extend(_iter_tensors({k: v for k, v in kwargs.items() if k != "out"}))
        if not ins:
            return out
        provs = [self.prov_of(t) for t in ins]
        union = _EMPTY.union(*provs)
        if not union:
            return out
        name = getattr(func, "__name__", "")
        kind = _MERGES.get(name)
        if kind is not None:
            operands = [(t, p) for t, p in zip(ins, provs) if p]
            if len(operands) >= 2 and len(set(p for _, p in operands)) >= 2:
                node = self._merge(kind, operands, out)
                union = frozenset((node.index,))
        outputs = list(_iter_tensors(out))
        if "out" in kwargs:
            outputs.extend(_iter_tensors(kwargs["out"]))
        if out is None and name == "__setitem__" and ins:
            outputs.append(ins[0])
        for t in outputs:
            self.set_prov(t, union)
        return out

    def _merge(self, kind: str, operands: list, out: Any) -> _Node:
        scope = self._current_scope()
        base = _MERGE_BASENAME[kind]
        full = f"{scope}.{base}" if scope else base
        node = _Node(index=len(self.nodes), type=kind, qualname=full)
        self.nodes.append(node)
        node.name = self.unique_name(full)
        node.scope = scope or None
        for _, prov in operands:
            self._take_sources(node, prov)
        # the operand computed by a layer, rather than a parameter (a ViT's class token), is the input
        first = next((t for t, prov in operands if any(isinstance(k, int) for k in prov)), operands[0][0])
        node.input_shape = self.batchless(first, None, 0, is_output=False)
        node.extra["inputShapes"] = [self.batchless(t, None, 0, is_output=False) for t, _ in operands]
        outs = list(_iter_tensors(out))
        for t in outs:
            node.output_shapes.append(self.batchless(t, None, 0, is_output=True))
            node.output_bytes += t.numel() * t.element_size()
        if outs:
            node.output_dtype = dtype_name(outs[0].dtype)
        return node

    def on_flops(self, flops: int | None, op: str) -> None:
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

    # --- shapes -----------------------------------------------------------------------------
    def batchless(self, t: torch.Tensor, module: nn.Module | None, index: int, *, is_output: bool) -> "_RawShape":
        """The tensor's full shape and, when a known layer says so, its batch axis; the batch is
        stripped when the graph is built (:func:`_strip`), once the batch size is settled."""
        shape = tuple(int(d) for d in t.shape)
        return _RawShape(shape, _known_batch_axis(module, index, len(shape), is_output) if shape else None)

    def learn_batch(self, module: nn.Module, t: torch.Tensor, prov: frozenset) -> None:
        """A sequence-first layer fed straight from a model input tells the true batch size:
        ``--input`` is read batch first, but a sequence-first model is called with ``(L, N, E)``."""
        if self._batch_learned or t.dim() != 3:
            return
        axis = _known_batch_axis(module, 0, 3, False)
        if axis != 1 or not any(isinstance(k, int) and self.nodes[k].type == "input" for k in prov):
            return
        self._batch_learned = True
        self.batch_size = int(t.shape[1])


class _RawShape(tuple):
    """``(shape, batch_axis)``: ``batch_axis`` None lets :func:`_strip` find the batch."""

    def __new__(cls, shape: tuple, axis: int | None) -> "_RawShape":
        return super().__new__(cls, (shape, axis))


def _strip(raw: "_RawShape | None", batch_size: int) -> list[int]:
    """The shape without its batch axis.

    Known sequence-first layers say where the batch is (nn.RNNBase: axis 1 for the sequence unless
    ``batch_first``, axis 1 always for ``h_n``/``c_n``; nn.MultiheadAttention and nn.Transformer*
    with ``batch_first=False``: axis 1; -1 for an unbatched input). Otherwise the batch is the first
    axis of the batch size; a tensor with no such axis (position ids, a table computed from
    parameters) has no batch and keeps its whole shape.
    """
    if raw is None:
        return []
    shape, axis = raw
    if not shape:
        return []
    if axis is None:
        if batch_size not in shape:
            return list(shape)
        axis = shape.index(batch_size)
    if axis < 0 or axis >= len(shape):
        return list(shape)
    return list(shape[:axis] + shape[axis + 1:])


def _known_batch_axis(module: nn.Module | None, index: int, ndim: int, is_output: bool) -> int | None:
    if module is None:
        return None
    target = getattr(module, "_neurarch_inner", module)
    if _is_recurrent(target):
        if index == 0:
            if ndim == 2:
                return -1
            return 0 if target.batch_first else 1
        return 1 if ndim == 3 else -1
    batch_first = getattr(target, "batch_first", None)
    if batch_first is None and type(target).__module__.startswith("torch.nn") and type(target).__name__.startswith("Transformer"):
        attn = next((m for m in target.modules() if isinstance(m, nn.MultiheadAttention)), None)
        batch_first = attn.batch_first if attn is not None else None
    if isinstance(target, nn.MultiheadAttention) or (
        batch_first is False and type(target).__name__.startswith("Transformer")
    ):
        if isinstance(target, nn.MultiheadAttention) and is_output and index == 1:
            return 0  # attention weights are (N, L, S) in either layout
        if ndim == 3:
            return 0 if batch_first else 1
    return None


def _is_recurrent(module: nn.Module) -> bool:
    """nn.LSTM/GRU/RNN, and their quantized versions (which do not subclass nn.RNNBase)."""
    if isinstance(module, nn.RNNBase):
        return True
    return type(module).__module__.startswith("torch.ao.nn.quantized") and all(
        hasattr(module, attr) for attr in ("mode", "hidden_size", "num_layers", "bidirectional", "batch_first")
    )


def _packed_param_count(module: nn.Module) -> int:
    """Elements of quantized packed weights and biases (they are not nn.Parameters)."""
    target = getattr(module, "_neurarch_inner", module)
    total = 0
    if not target._modules and not type(target).__module__.startswith("torch.ao.nn.quantized"):
        return 0  # the common case: a float leaf layer
    for sub in target.modules():
        weight = getattr(sub, "weight", None)
        if callable(weight) and type(sub).__module__.startswith("torch.ao.nn.quantized"):
            try:
                w = weight()
                total += w.numel()
                b = sub.bias() if callable(getattr(sub, "bias", None)) else None
                if b is not None:
                    total += b.numel()
            except Exception:  # noqa: BLE001 - an unusual packed layout: leave it out
                pass
        elif _is_recurrent(sub) and type(sub).__module__.startswith("torch.ao.nn.quantized"):
            try:
                parts = list(sub.get_weight().values()) + list(sub.get_bias().values())
                total += sum(x.numel() for x in parts if isinstance(x, torch.Tensor))
            except Exception:  # noqa: BLE001 - an unusual packed layout: leave it out
                pass
    return total


class _Opaque(nn.Module):
    """Stands in for a TorchScript submodule (which refuses Python hooks) during the trace."""

    _neurarch_opaque = True

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_neurarch_inner", inner)
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)


def _swap_script_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Replace TorchScript children by :class:`_Opaque` wrappers; returns what to put back."""
    swapped = []
    for parent in list(model.modules()):
        if isinstance(parent, torch.jit.ScriptModule):
            continue
        for name, child in list(parent._modules.items()):
            if isinstance(child, torch.jit.ScriptModule):
                parent._modules[name] = _Opaque(child)
                swapped.append((parent, name, child))
    return swapped


def _named_tensors(name: str, value: Any, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside one forward argument, named by its path: ``xs.0``, ``batch.image``."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif depth > 8 or value is None or isinstance(value, (str, bytes)):
        return
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _named_tensors(f"{name}.{key}", item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _named_tensors(f"{name}.{i}", item, depth + 1)


def _restore(swapped: list[tuple[nn.Module, str, nn.Module]]) -> None:
    for parent, child_name, child in swapped:
        parent._modules[child_name] = child


def _split_inputs(model: nn.Module, inputs: Any) -> tuple[tuple, dict]:
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)):
        return tuple(inputs), {}
    raise TypeError(
        f"inputs must be a tensor, a sequence of tensors or a dict of keyword arguments, not {type(inputs).__name__}"
    )


def _input_names(model: nn.Module, n_args: int) -> list[str]:
    try:
        params = [
            p for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n_args]]
    return names + [f"input_{i}" for i in range(len(names), n_args)]


def trace_model(
    model: nn.Module,
    inputs: Any,
    *,
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    depth: int | None = None,
    description: str | None = None,
    progress: Callable[[int], None] | None = None,
    training_step: bool = True,
) -> dict:
    """Run one forward pass of ``model`` on ``inputs`` and return the ``.neurarch.json`` graph.

    Args:
        model: any ``nn.Module``; ``torch.compile``, nn.DataParallel and DDP wrappers are traced as
            the model inside them.
        inputs: one tensor, a sequence of tensors (positional arguments) or a dict (keyword
            arguments), batch first. The first dim of the first tensor is the batch size.
        kwargs: more keyword arguments, passed after positional ``inputs``.
        name: the graph's name (default: the model's class name).
        depth: stop descending at this depth (1 = the root's children); a container cut off there
            is one node. ``None`` descends to the leaves.
        description: the top-level ``description`` (default: says what traced it and the inputs).
        progress: called with the number of layer calls recorded so far, from the hooks.
        training_step: after the trace, rehearse one mixed-precision AdamW training step on the
            meta device (:mod:`neurarch_trace.rehearsal`) and record what it needs in
            ``measured.training`` and each layer's ``measured.savedBytes``; a step that cannot be
            rehearsed leaves ``measured.training.error`` and the trace stands.

    Returns:
        The graph as a dict (see ``shared/spec/neurarch-graph.md`` and ``docs/measured.md``):
        shapes batchless, FLOPs at the traced batch size, one multiply-add = 2 FLOPs.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``inputs`` has another type.
        ValueError: no input tensor, a 0-d first input, or ``depth`` below 0.
        TraceError: the forward pass raised; the message says how far the trace got and repeats the
            model's own complaint; the original exception is chained.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be 0 or more, not {depth}")
    model = unwrap_model(model)
    if isinstance(model, torch.jit.ScriptModule):
        model = _Opaque(model)  # a scripted model refuses hooks: trace it as one opaque layer
    args, call_kwargs = _split_inputs(model, inputs)
    if kwargs:
        call_kwargs = {**call_kwargs, **kwargs}
    kwargs = call_kwargs
    named_inputs = list(zip(_input_names(model, len(args)), args)) + list(kwargs.items())
    tensors = [pair for n, value in named_inputs for pair in _named_tensors(n, value)]
    if not tensors:
        raise ValueError("inputs hold no tensor: give at least one input tensor, batch first")
    if tensors[0][1].dim() == 0:
        raise ValueError(f"input {tensors[0][0]!r} is a 0-d tensor: inputs are batch first, e.g. shape (1, 3, 224, 224)")
    batch_size = int(tensors[0][1].shape[0])
    graph_name = name or type(model).__name__

    swapped = _swap_script_modules(model)
    try:
        tracer = _Tracer(model, depth=depth, batch_size=batch_size)
    except BaseException:
        _restore(swapped)
        raise
    tracer.root_name = graph_name
    tracer._scope_modules = []
    for input_name, t in tensors:
        node = _Node(index=len(tracer.nodes), type="input")
        tracer.nodes.append(node)
        node.name = input_name  # made unique against layer names once the trace is done
        node.output_shapes = [tracer.batchless(t, None, 0, is_output=False)]
        node.output_dtype = dtype_name(t.dtype)
        node.output_bytes = t.numel() * t.element_size()
        node.extra = {"shape": [int(d) for d in t.shape], "dtype": dtype_name(t.dtype)}
        tracer.set_prov(t, frozenset((node.index,)))
    tracer._names.add("output")
    input_count = len(tracer.nodes)

    training = {m: m.training for m in model.modules()}
    handles = []
    recorded = [0]

    def pre(module: nn.Module, a: tuple, kw: dict) -> None:
        tracer.pre_hook(module, a, kw)
        if progress is not None and len(tracer.nodes) != recorded[0]:
            recorded[0] = len(tracer.nodes)
            progress(recorded[0] - input_count)

    def post(module: nn.Module, a: tuple, kw: dict, out: Any) -> None:
        tracer.post_hook(module, a, kw, out)

    gc_was_enabled = gc.isenabled()
    gc.disable()  # the trace makes many small objects; full collections would cost more than the trace
    try:
        for module in model.modules():
            if isinstance(module, torch.jit.ScriptModule):
                continue
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True))
        model.eval()
        tracer.flow_mode = _FlowMode(tracer)
        with torch.enable_grad(), FlopMode(tracer.on_flops, tracer.scalars), tracer.flow_mode:
            try:
                output = model(*args, **kwargs)
            finally:
                tracer.restore_flow()  # a forward that raised inside a layer left the mode popped
    except Exception as exc:
        where = _where(tracer)
        if _on_meta(model, args, kwargs) and _needs_values(exc):
            raise TraceError(
                f"the forward pass needs real tensor values, which the meta device does not have, {where} "
                f"({_one_line(exc)}): trace on the CPU instead (--device cpu)"
            ) from exc
        shown = ", ".join(f"{n} {_shape_text(t)}" for n, t in tensors)
        raise TraceError(
            f"the forward pass failed {where} with inputs {shown}: {_one_line(exc)}; "
            "check the input shapes and dtypes against what the model's forward expects"
        ) from exc
    finally:
        if gc_was_enabled:
            gc.enable()
        for handle in handles:
            handle.remove()
        _restore(swapped)
        for module, flag in training.items():
            module.training = flag

    step = (rehearse_training_step(model, args, kwargs, batch_size=tracer.batch_size, scalars=tracer.scalars)
            if training_step else None)
    layers = None
    if depth is not None:  # the card describes the model whatever the depth: count the layers at full depth
        full = trace_model(model, tuple(args) if args else dict(kwargs), kwargs=kwargs if args else None,
                           training_step=False)
        layers = sum(1 for c in full["components"] if c["type"] not in ("input", "output"))
    graph = _build_graph(tracer, graph_name, output, named_inputs, description, input_count)
    _attach_training(graph, tracer, step, layers)
    return graph


def _on_meta(model: nn.Module, args: tuple, kwargs: dict) -> bool:
    tensors = list(_iter_tensors(args)) + list(_iter_tensors(kwargs))
    return any(t.is_meta for t in tensors) or any(p.is_meta for p in model.parameters())


def _needs_values(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "meta" in text or "data-dependent" in text or "item()" in text


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0].strip()
    if len(first) > 160 and ". " in first:
        first = first.split(". ", 1)[0] + "."
    return f"{type(exc).__name__}: {first}"


def _where(tracer: _Tracer) -> str:
    running = [value for kind, value in tracer._stack if kind == "layer"]
    layers = [n for n in tracer.nodes if n.type != "input"]
    if running:
        node = running[-1]
        cls = type(node.module).__name__ if node.module is not None else node.type
        return f"in layer {node.name!r} ({cls}) after {_plural(len(layers) - 1, 'layer')}"
    scope = tracer._current_scope()
    if scope:
        return f"in {scope!r} after {_plural(len(layers), 'layer')}"
    return f"after {_plural(len(layers), 'layer')}"


def _shape_text(t: torch.Tensor) -> str:
    return f"{'x'.join(str(int(d)) for d in t.shape) or 'scalar'} {dtype_name(t.dtype)}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _build_graph(tracer: _Tracer, graph_name: str, output: Any, named_inputs: list, description: str | None, input_count: int) -> dict:
    nodes = tracer.nodes
    out_node = _Node(index=len(nodes), type="output", name="output")
    outs = list(_iter_tensors(output))
    if not outs and hasattr(output, "__dict__") and not isinstance(output, nn.Module):
        # an object that is no container (a torch.distributions.Categorical): the tensors it holds
        outs = [t for value in vars(output).values() for t in _iter_tensors(value)]
    for t in outs:
        prov = tracer.prov_of(t)
        out_node.add_sources(frozenset(k for k in prov if isinstance(k, int)))
        for key in prov:
            if isinstance(key, str):
                # parameters reaching the output through functional code only: the last layer
                # feeding the output owns them
                feeder = nodes[next(reversed(out_node.sources))] if out_node.sources else None
                if feeder is not None:
                    tracer._own_key(feeder, key)
    if outs:
        out_node.input_shape = tracer.batchless(outs[0], None, 0, is_output=True)
        out_node.output_shapes = [tracer.batchless(t, None, 0, is_output=True) for t in outs]
    nodes.append(out_node)

    for node in nodes[:input_count]:  # a layer keeps its module path; a clashing input is renamed
        base = node.name if node.name not in tracer._names else f"input:{node.name}"
        node.name = tracer.unique_name(base)
    batch = tracer.batch_size
    for node in nodes:
        node.input_shape = _strip(node.input_shape, batch) if node.input_shape is not None else None
        node.output_shapes = [_strip(raw, batch) for raw in node.output_shapes]
        if "inputShapes" in node.extra:
            node.extra["inputShapes"] = [_strip(raw, batch) for raw in node.extra["inputShapes"]]
        if node.type == "input":
            node.params = {"shape": node.output_shapes[0]}

    ids = [f"n{n.index}" for n in nodes]
    edges: list[tuple[int, int]] = []
    has_in = [False] * len(nodes)
    has_out = [False] * len(nodes)
    for node in nodes:
        for src in node.sources:
            edges.append((src, node.index))
            has_in[node.index] = True
            has_out[src] = True
    synthetic: list[int] = []
    for node in nodes:
        if node.type != "input" and not has_in[node.index]:
            synthetic.append(len(edges))
            edges.append((0, node.index))
            has_in[node.index] = True
            has_out[0] = True
    for node in nodes:
        if node.type != "output" and not has_out[node.index]:
            synthetic.append(len(edges))
            edges.append((node.index, out_node.index))
            has_out[node.index] = True
    positions = layout(ids, [(ids[a], ids[b]) for a, b in edges])
    ins_of: dict[int, list[str]] = {n.index: [] for n in nodes}
    outs_of: dict[int, list[str]] = {n.index: [] for n in nodes}
    for a, b in edges:
        ins_of[b].append(ids[a])
        outs_of[a].append(ids[b])

    components = []
    layer_flops = 0
    activation_bytes = 0
    uncounted_all: set[str] = set(tracer.functional_uncounted)
    for node in nodes:
        comp: dict[str, Any] = {"id": ids[node.index], "name": node.name, "type": node.type}
        if node.scope:
            comp["scope"] = node.scope
        comp["params"] = node.params
        if node.type != "input" and node.input_shape and _positive(node.input_shape):
            comp["inputShape"] = node.input_shape
        if node.type != "output" and node.output_shapes and node.output_shapes[0] and _positive(node.output_shapes[0]):
            comp["outputShape"] = node.output_shapes[0]
        comp["position"] = positions[ids[node.index]]
        comp["inputs"] = ins_of[node.index]
        comp["outputs"] = outs_of[node.index]
        measured: dict[str, Any] = {}
        if node.type == "input":
            measured = {"dtype": node.extra["dtype"], "shape": node.extra["shape"], "outputBytes": node.output_bytes}
        elif node.type == "output":
            measured = {"outputShapes": node.output_shapes}
        else:
            measured["params"] = node.own_params
            if node.own_buffers:
                measured["buffers"] = node.own_buffers
            if node.packed_params:
                measured["packedParams"] = node.packed_params
            if node.shared_with is not None:
                measured["sharedWith"] = ids[node.shared_with]
            if node.uncounted:
                measured["flops"] = None
                measured["uncounted"] = sorted(node.uncounted)
                uncounted_all |= node.uncounted
            else:
                measured["flops"] = node.flops
                layer_flops += node.flops
            if "inputShapes" in node.extra:
                measured["inputShapes"] = node.extra["inputShapes"]
            if node.output_dtype is not None:
                measured["outputDtype"] = node.output_dtype
            measured["outputBytes"] = node.output_bytes
            measured["outputShapes"] = node.output_shapes
            activation_bytes += node.output_bytes
        comp["measured"] = measured
        components.append(comp)

    connections = [
        {"id": f"e{i}", "from": ids[a], "to": ids[b], "fromPort": "bottom", "toPort": "top"}
        for i, (a, b) in enumerate(edges)
    ]

    totals = _totals(tracer.model)
    owned = sum(n.own_params for n in nodes)
    input_specs = [
        {"name": n.name, "shape": n.extra["shape"], "dtype": n.extra["dtype"]}
        for n in nodes[:input_count]
    ]
    if description is None:
        shown = ", ".join(f"{s['name']} {'x'.join(map(str, s['shape']))} {s['dtype']}" for s in input_specs)
        description = f"Traced by neurarch-trace {__version__} from {type(tracer.model).__name__} with inputs {shown}."
    measured_top = {
        "tool": f"neurarch-trace/{__version__}",
        "device": _device_of(tracer.model, named_inputs),
        "batchSize": tracer.batch_size,
        "inputs": input_specs,
        "params": totals["params"],
        "trainableParams": totals["trainable"],
        "frozenParams": totals["params"] - totals["trainable"],
        "packedParams": sum(n.packed_params for n in nodes if n.shared_with is None),
        "paramBytes": totals["param_bytes"],
        "buffers": totals["buffers"],
        "bufferBytes": totals["buffer_bytes"],
        "unusedParams": totals["params"] - owned,
        "flops": layer_flops + tracer.functional_flops,
        "layerFlops": layer_flops,
        "functionalFlops": tracer.functional_flops,
        "uncountedOps": sorted(uncounted_all),
        "activationBytes": activation_bytes,
        "syntheticConnections": [f"e{i}" for i in synthetic],
    }
    return {
        "id": _slug(graph_name),
        "name": graph_name,
        "description": description,
        "components": components,
        "connections": connections,
        "measured": measured_top,
    }


def _attach_training(graph: dict, tracer: _Tracer, training: dict | None, layers: int | None) -> None:
    """Whole-model facts that no ``--depth`` changes: FLOPs by kind, the full-depth layer count, the
    rehearsed training step; and each layer call's bytes saved for backward, matched by qualified
    name and call order (``docs/measured.md``)."""
    top = graph["measured"]
    top["flopsByKind"] = dict(sorted(tracer.flops_by_kind.items()))
    top["layers"] = layers if layers is not None else sum(
        1 for c in graph["components"] if c["type"] not in ("input", "output"))
    if training is None:
        return
    top["training"] = training["measured"]
    saved, calls = training["savedBytes"], {}
    for node, comp in zip(tracer.nodes, graph["components"]):
        if node.type in ("input", "output", "add", "concatenate", "stack") or node.qualname not in saved:
            continue
        k = calls.get(node.qualname, 0)
        calls[node.qualname] = k + 1
        if k < len(saved[node.qualname]):
            comp["measured"]["savedBytes"] = saved[node.qualname][k]


def _positive(shape: list[int]) -> bool:
    return all(d > 0 for d in shape)


def _slug(name: str) -> str:
    out = "".join(ch.lower() if ch.isalnum() else "-" for ch in name).strip("-")
    return out or "model"


def _device_of(model: nn.Module, named_inputs: list) -> str:
    for p in model.parameters():
        return p.device.type
    for _, t in named_inputs:
        if isinstance(t, torch.Tensor):
            return t.device.type
    return "cpu"


def _totals(model: nn.Module) -> dict[str, int]:
    params = trainable = param_bytes = buffers = buffer_bytes = 0
    for p in model.parameters():  # parameters() yields each Parameter once
        params += p.numel()
        param_bytes += p.numel() * p.element_size()
        if p.requires_grad:
            trainable += p.numel()
    for b in model.buffers():
        buffers += b.numel()
        buffer_bytes += b.numel() * b.element_size()
    return {
        "params": params,
        "trainable": trainable,
        "param_bytes": param_bytes,
        "buffers": buffers,
        "buffer_bytes": buffer_bytes,
    }
