"""Merges: functional calls that join two or more data paths become ``add``/``concatenate``/``stack`` nodes.

An add/sub, a concatenation or a stack (in-place ``+=`` too) whose operands come from different
producers is a merge point of the data flow (a residual add, a U-Net skip concatenation). One with a
single producer (``x + x``, ``x + 1``) is ordinary functional code and gets no node.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from neurarch_trace.trace.batch import raw_shape
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
    if len(operands) >= 2 and len({p for _, p in operands}) >= 2:
        return operands
    return None


def merge_record(index: int, kind: str, scope: str, operands: Operands, out: Any) -> LayerCall:
    """The record of a merge of ``operands`` into ``out`` inside ``scope``; its name and sources
    are given by the caller."""
    record = LayerCall(index=index, type=kind, qualname=f"{scope}.{BASENAME[kind]}" if scope else BASENAME[kind])
    record.scope = scope or None
    # the operand computed by a layer, rather than a parameter (a ViT's class token), is the input
    first = next((t for t, prov in operands if any(isinstance(k, int) for k in prov)), operands[0][0])
    record.input_shape = raw_shape(first, None, 0, is_output=False)
    record.operand_shapes = [raw_shape(t, None, 0, is_output=False) for t, _ in operands]
    outs = unique_tensors(out)
    for t in outs:
        record.output_shapes.append(raw_shape(t, None, 0, is_output=True))
        record.output_bytes += t.numel() * t.element_size()
    if outs:
        record.output_dtype = dtype_name(outs[0].dtype)
    return record
