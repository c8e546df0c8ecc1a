"""Merges: functional calls that join two or more data paths become ``add``/``concatenate``/``stack`` nodes.

An add/sub, a concatenation or a stack (in-place ``+=`` too) whose operands come from different
producers is a merge point of the data flow (a residual add, a U-Net skip concatenation). One with a
single producer (``x + x``, ``x + 1``) is ordinary functional code and gets no node.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from neurarch_trace.trace.axes import NO_BATCH, UNKNOWN, Merged, known
from neurarch_trace.trace.batch import BatchAxes
from neurarch_trace.trace.records import LayerCall
from neurarch_trace.trace.tensors import dtype_name, unique_tensors

__all__ = ["BASENAME", "MERGES", "merge_operands", "merge_record"]

#: Function name -> merge type.
MERGES: Dict[str, str] = {
    **{name: "add" for name in ("add", "add_", "__add__", "__radd__", "__iadd__",
                                "sub", "sub_", "__sub__", "__rsub__", "__isub__", "subtract")},
    **{name: "concatenate" for name in ("cat", "concat", "concatenate", "hstack", "vstack",
                                        "dstack", "column_stack", "row_stack")},
    "stack": "stack",
}
#: Merge type -> the last part of its node's name (``layer1.0.add``).
BASENAME = {"add": "add", "concatenate": "cat", "stack": "stack"}

Operands = List[Tuple[torch.Tensor, frozenset]]


def merge_operands(ins: List[torch.Tensor], provs: List[frozenset]) -> Optional[Operands]:
    """The operands that carry provenance, when at least two of them come from different
    producers; None when the call merges nothing."""
    operands = [(t, p) for t, p in zip(ins, provs) if p]
    if len(operands) == 2:  # the common case (a residual add): no set
        return operands if operands[0][1] != operands[1][1] else None
    if len(operands) > 2 and len({p for _, p in operands}) >= 2:
        return operands
    return None


def merge_record(index: int, kind: str, scope: str, operands: Operands, out: Any, axes: BatchAxes) -> LayerCall:
    """The record of a merge of ``operands`` into ``out`` inside ``scope``; its name and sources
    are given by the caller. An operand whose batch axis was lost (a class token expanded to
    ``x.shape[0]``) gets the one the merge aligns it with (:func:`_aligned_operand`)."""
    record = LayerCall(index=index, type=kind, qualname=f"{scope}.{BASENAME[kind]}" if scope else BASENAME[kind])
    record.scope = scope or None
    outs = unique_tensors(out)
    if outs:
        for t, _ in operands:
            if axes.of(t) is UNKNOWN:
                state = _aligned_operand(kind, t, outs[0], axes.of(outs[0]))
                if state is not UNKNOWN:
                    axes.refine(t, state)
    # the operand computed by a layer, rather than a parameter (a ViT's class token), is the input
    computed = [_computed(prov) for _, prov in operands]
    shape = axes.shape
    record.operand_shapes = [shape(t) for t, _ in operands]
    record.input_shape = record.operand_shapes[computed.index(True) if True in computed else 0]
    record.param_operands = [] if all(computed) else learned_operands(operands)
    for t in outs:
        record.output_shapes.append(shape(t))
        record.output_bytes += t.numel() * t.element_size()
    if outs:
        record.output_dtype = dtype_name(outs[0].dtype)
    return record


def learned_operands(operands: Operands) -> list:
    """The operands that are learned tensors read directly in ``forward`` (a ViT's ``cls_token``
    and ``pos_embed``), not computed by any layer or input: ``{"operand": i, "params": [...],
    "buffers": [...]}`` with the names of the parameters and buffers each is made of (``operand``
    indexes the node's ``inputShapes``). An operand a layer computed, even one scaled by a learned
    gate, is not listed."""
    found = []
    for i, (_, prov) in enumerate(operands):
        if _computed(prov):
            continue
        entry: dict = {"operand": i}
        params = sorted(k[len("param:"):] for k in prov if k.startswith("param:"))
        buffers = sorted(k[len("buffer:"):] for k in prov if k.startswith("buffer:"))
        if params:
            entry["params"] = params
        if buffers:
            entry["buffers"] = buffers
        found.append(entry)
    return found


def _computed(prov: frozenset) -> bool:
    """The provenance names a record (a layer, a merge or an input), not only parameters."""
    for key in prov:
        if type(key) is int:
            return True
    return False


def _aligned_operand(kind: str, t: torch.Tensor, out: torch.Tensor, state: Any) -> Any:
    """The batch state of an operand the merge lines up with the output's batch axis: the same
    axis for a concatenation, the same axis from the end for an add (broadcasting), when the sizes
    agree. An add operand that lacks that axis, or has size 1 there, is broadcast over the batch
    (its other axes meet the output's, which carry no batch): it has none."""
    if not known(state) or isinstance(state, Merged):
        return UNKNOWN
    if kind == "concatenate" and t.dim() == out.dim() and t.shape[state] == out.shape[state]:
        return state
    if kind == "add":
        p = state - (out.dim() - t.dim())
        if p < 0 or (t.shape[p] == 1 and out.shape[state] != 1):
            return NO_BATCH
        if t.shape[p] == out.shape[state]:
            return p
    return UNKNOWN
