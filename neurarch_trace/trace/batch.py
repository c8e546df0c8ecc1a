"""Batch-axis handling: which axis of a tensor is the batch, and the shapes without it.

During the trace a shape is kept whole, as a :class:`RawShape` with the batch axis when a known
layer says where it is; :func:`strip` drops the batch once the batch size is settled, because a
sequence-first model reveals its true batch only when its first sequence-first layer runs
(:class:`BatchSize`).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
from torch import nn

from neurarch_trace.trace.modules import inner, is_recurrent

__all__ = ["BatchSize", "RawShape", "known_batch_axis", "raw_shape", "strip"]


class RawShape(tuple):
    """``(shape, batch_axis)``: ``batch_axis`` None lets :func:`strip` find the batch."""

    def __new__(cls, shape: tuple, axis: Optional[int]) -> RawShape:
        return super().__new__(cls, (shape, axis))


def raw_shape(t: torch.Tensor, module: Optional[nn.Module], index: int, *, is_output: bool) -> RawShape:
    """The tensor's full shape and, when a known layer says so (``module`` produced or received
    it as its ``index``-th tensor), its batch axis."""
    shape = tuple(map(int, t.shape))
    return RawShape(shape, known_batch_axis(module, index, len(shape), is_output) if shape else None)


def strip(raw: Optional[RawShape], batch_size: int) -> List[int]:
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


def _transformer_batch_first(target: nn.Module) -> Optional[bool]:
    batch_first = getattr(target, "batch_first", None)
    cls = type(target)
    torch_transformer = cls.__module__.startswith("torch.nn") and cls.__name__.startswith("Transformer")
    if batch_first is None and torch_transformer:
        attn = next((m for m in target.modules() if isinstance(m, nn.MultiheadAttention)), None)
        batch_first = attn.batch_first if attn is not None else None
    return batch_first


def known_batch_axis(module: Optional[nn.Module], index: int, ndim: int, is_output: bool) -> Optional[int]:
    """The batch axis of the ``index``-th input (or output) tensor of ``module`` with ``ndim``
    dims, when the layer's type fixes it; None when it does not (-1: the tensor is unbatched)."""
    if module is None:
        return None
    target = inner(module)
    if is_recurrent(target):
        if index == 0:
            if ndim == 2:
                return -1
            return 0 if target.batch_first else 1
        return 1 if ndim == 3 else -1
    is_mha = isinstance(target, nn.MultiheadAttention)
    if not is_mha and not type(target).__name__.startswith("Transformer"):
        return None  # the common case, without the attribute look-ups below
    batch_first = _transformer_batch_first(target)
    if is_mha or (batch_first is False and type(target).__name__.startswith("Transformer")):
        if isinstance(target, nn.MultiheadAttention) and is_output and index == 1:
            return 0  # attention weights are (N, L, S) in either layout
        if ndim == 3:
            return 0 if batch_first else 1
    return None


class BatchSize:
    """The batch size the shapes are stripped of: the first input's first dim, unless a
    sequence-first layer fed straight from a model input says otherwise (``--input`` is read batch
    first, but a sequence-first model is called with ``(L, N, E)``)."""

    def __init__(self, traced: int) -> None:
        self.value = traced
        self._learned = False

    def learn(self, module: nn.Module, t: torch.Tensor, prov: frozenset, records: List[Any]) -> None:
        """Read the batch off ``t``, the first input of ``module``, when its provenance ``prov``
        says it comes straight from a model input (an ``input`` record of ``records``)."""
        if self._learned or t.dim() != 3:
            return
        axis = known_batch_axis(module, 0, 3, False)
        if axis != 1 or not any(isinstance(k, int) and records[k].type == "input" for k in prov):
            return
        self._learned = True
        self.value = int(t.shape[1])
