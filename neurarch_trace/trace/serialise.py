"""Serialisation: a :class:`~.records.Recording` to the ``.neurarch.json`` graph dict.

Shapes lose their batch axis (:func:`~.batch.strip`), records become components with the
vocabulary's fields and a ``measured`` block (``docs/measured.md``), sources become connections, and
a node fed only by constants gets a synthetic edge from the first input (a dead end one to the
output), so the graph is clean; those edges are listed in ``measured.syntheticConnections``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace._version import __version__
from neurarch_trace.contract import layout
from neurarch_trace.text import shape_text
from neurarch_trace.trace.batch import strip
from neurarch_trace.trace.ownership import model_totals
from neurarch_trace.trace.records import LayerCall, Recording

__all__ = ["build_graph"]

Edges = List[Tuple[int, int]]


def _positive(shape: List[int]) -> bool:
    return not shape or min(shape) > 0


def _slug(name: str) -> str:
    out = "".join(ch.lower() if ch.isalnum() else "-" for ch in name).strip("-")
    return out or "model"


def _stripped(raws: List[Any], field: str, unknown: List[str]) -> List[List[int]]:
    """The shapes of ``raws`` without their batch axis; ``field.format(i)`` of each one whose
    batch axis was unknown appended to ``unknown``."""
    shapes = []
    for i, raw in enumerate(raws):
        shape, lost = strip(raw)
        if lost:
            unknown.append(field.format(i))
        shapes.append(shape)
    return shapes


def _strip_batch(records: List[LayerCall]) -> None:
    """Shapes without their batch axis; the fields whose batch axis could not be followed (kept
    whole) are named in ``record.batch_unknown``."""
    for record in records:
        unknown: List[str] = []
        if record.input_shape is not None:
            record.input_shape = _stripped([record.input_shape], "inputShape", unknown)[0]
        record.output_shapes = _stripped(record.output_shapes,
                                         "outputShape" if record.type == "input" else "outputShapes.{}", unknown)
        if record.operand_shapes is not None:
            record.operand_shapes = _stripped(record.operand_shapes, "inputShapes.{}", unknown)
        if record.type == "input":
            record.params = {"shape": record.output_shapes[0]}
        record.batch_unknown = unknown


def _edges(records: List[LayerCall]) -> Tuple[Edges, List[int]]:
    """Every source as an edge, then the synthetic ones: from the first input to each node with
    no producer, from each node with no consumer to the output (the last record). Returns the
    edges and the positions of the synthetic ones."""
    out_index = records[-1].index
    edges: Edges = []
    has_in = [False] * len(records)
    has_out = [False] * len(records)
    for record in records:
        for src in record.sources:
            edges.append((src, record.index))
            has_in[record.index] = True
            has_out[src] = True
    synthetic: List[int] = []
    for record in records:
        if record.type != "input" and not has_in[record.index]:
            synthetic.append(len(edges))
            edges.append((0, record.index))
            has_out[0] = True
    for record in records:
        if record.type != "output" and not has_out[record.index]:
            synthetic.append(len(edges))
            edges.append((record.index, out_index))
    return edges, synthetic


def _measured(record: LayerCall, ids: Sequence[str]) -> Dict[str, Any]:
    """A component's ``measured`` block."""
    lost = {"batchUnknown": record.batch_unknown} if record.batch_unknown else {}
    if record.type == "input":
        return {"dtype": record.traced_dtype, "shape": record.traced_shape, "outputBytes": record.output_bytes,
                **lost}
    if record.type == "output":
        return {"outputShapes": record.output_shapes, **lost}
    measured: Dict[str, Any] = {"params": record.own_params}
    if record.own_buffers:
        measured["buffers"] = record.own_buffers
    if record.packed_params:
        measured["packedParams"] = record.packed_params
    if record.shared_with is not None:
        measured["sharedWith"] = ids[record.shared_with]
    if record.uncounted:
        measured["flops"] = None
        measured["uncounted"] = sorted(record.uncounted)
    else:
        measured["flops"] = record.flops
    if record.operand_shapes is not None:
        measured["inputShapes"] = record.operand_shapes
    if record.param_operands:
        measured["paramOperands"] = record.param_operands
    if record.output_dtype is not None:
        measured["outputDtype"] = record.output_dtype
    measured["outputBytes"] = record.output_bytes
    measured["outputShapes"] = record.output_shapes
    measured.update(lost)
    return measured


def _component(record: LayerCall, ids: Sequence[str], position: Dict[str, int],
               inputs: List[str], outputs: List[str]) -> Dict[str, Any]:
    comp: Dict[str, Any] = {"id": ids[record.index], "name": record.name, "type": record.type}
    if record.scope:
        comp["scope"] = record.scope
    comp["params"] = record.params if record.params is not None else {}
    if record.type != "input" and record.input_shape and _positive(record.input_shape):
        comp["inputShape"] = record.input_shape
    first_out = record.output_shapes[0] if record.output_shapes else None
    if record.type != "output" and first_out and _positive(first_out):
        comp["outputShape"] = first_out
    comp["position"] = position
    comp["inputs"] = inputs
    comp["outputs"] = outputs
    comp["measured"] = _measured(record, ids)
    return comp


def _components(records: List[LayerCall], edges: Edges) -> List[Dict[str, Any]]:
    ids = [f"n{r.index}" for r in records]
    positions = layout(ids, [(ids[a], ids[b]) for a, b in edges])
    ins_of: Dict[int, List[str]] = {r.index: [] for r in records}
    outs_of: Dict[int, List[str]] = {r.index: [] for r in records}
    for a, b in edges:
        ins_of[b].append(ids[a])
        outs_of[a].append(ids[b])
    return [_component(r, ids, positions[ids[r.index]], ins_of[r.index], outs_of[r.index]) for r in records]


def _device_of(model: nn.Module, named_inputs: List[Tuple[str, Any]]) -> str:
    for p in walk.parameters(model):
        return p.device.type
    for _, t in named_inputs:
        if isinstance(t, torch.Tensor):
            return t.device.type
    return "cpu"


def _totals(recording: Recording, model: nn.Module, named_inputs: List[Tuple[str, Any]],
            input_specs: List[Dict[str, Any]], synthetic: List[int]) -> Dict[str, Any]:
    """The top-level ``measured`` block."""
    records = recording.records
    layers = [r for r in records if r.type not in ("input", "output")]
    counted = [r for r in layers if not r.uncounted]
    layer_flops = sum(r.flops for r in counted)
    uncounted = set(recording.functional_uncounted).union(*(r.uncounted for r in layers))
    totals = model_totals(model)
    return {
        "tool": f"neurarch-trace/{__version__}",
        "device": _device_of(model, named_inputs),
        "batchSize": recording.batch_size,
        "inputs": input_specs,
        "params": totals["params"],
        "trainableParams": totals["trainable"],
        "frozenParams": totals["params"] - totals["trainable"],
        "packedParams": sum(r.packed_params for r in records if r.shared_with is None),
        "paramBytes": totals["param_bytes"],
        "buffers": totals["buffers"],
        "bufferBytes": totals["buffer_bytes"],
        "unusedParams": totals["params"] - sum(r.own_params for r in records),
        "flops": layer_flops + recording.functional_flops,
        "layerFlops": layer_flops,
        "functionalFlops": recording.functional_flops,
        "uncountedOps": sorted(uncounted),
        "activationBytes": sum(r.output_bytes for r in layers),
        "syntheticConnections": [f"e{i}" for i in synthetic],
    }


def build_graph(recording: Recording, *, model: nn.Module, named_inputs: List[Tuple[str, Any]], name: str,
                description: Optional[str]) -> Dict[str, Any]:
    """The graph dict of ``recording`` (see ``shared/spec/neurarch-graph.md`` and
    ``docs/measured.md``): shapes batchless, FLOPs at the traced batch size."""
    records = recording.records
    _strip_batch(records)
    edges, synthetic = _edges(records)
    components = _components(records, edges)
    input_specs = [{"name": r.name, "shape": r.traced_shape, "dtype": r.traced_dtype}
                   for r in records[: recording.input_count]]
    if description is None:
        shown = ", ".join(f"{s['name']} {shape_text(s['shape'])} {s['dtype']}" for s in input_specs)
        description = f"Traced by neurarch-trace {__version__} from {type(model).__name__} with inputs {shown}."
    return {
        "id": _slug(name),
        "name": name,
        "description": description,
        "components": components,
        "connections": [
            {"id": f"e{i}", "from": f"n{a}", "to": f"n{b}", "fromPort": "bottom", "toPort": "top"}
            for i, (a, b) in enumerate(edges)
        ],
        "measured": _totals(recording, model, named_inputs, input_specs, synthetic),
    }
