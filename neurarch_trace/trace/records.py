"""The record of one node while the trace runs, and the trace's result.

Pure data: the hooks (:mod:`.recorder`) fill records in, :mod:`.serialise` turns them into the
graph's components. Units: shapes in elements per axis, bytes in bytes, FLOPs in floating-point
operations with one multiply-add = 2 FLOPs (``torch.utils.flop_counter``'s convention), parameter
counts in elements.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Set

from torch import nn

__all__ = ["LayerCall", "Recording", "key_order"]


def key_order(key: Any) -> tuple:
    """Sort key of provenance keys: record indices first, in order, then parameter/buffer names."""
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


@dataclasses.dataclass
class LayerCall:
    """One node of the graph being recorded: an input, a layer call, a merge, or the output.

    Fields:
        index: position in the recording, which is also the node's id (``n{index}``).
        type: the vocabulary type (``linear``, ``add``, ``input``, ``output``, ``customModule``).
        name: unique node name: the module path (``layer1.0.conv1``), ``#k`` on the k-th call of the
            same path; a merge is named ``<scope>.add`` (``cat``, ``stack``).
        params: the type's hyperparameters, with the vocabulary's keys.
        scope: the parent module's path; None at the top level.
        sources: provenance keys of the records feeding this one, in first-seen order (a dict used
            as an ordered set; the values are unused).
        input_shape: the first input tensor's shape, as a :class:`~.batch.RawShape` (full shape and
            batch state) during the trace, a batchless list once serialised.
        output_shapes: every output tensor's shape, the same way.
        output_dtype: dtype name of the first output tensor (``float32``).
        output_bytes: bytes of all output tensors at the traced batch.
        own_params / own_buffers: elements of the parameters / buffers this call owns (the first call
            that uses a tensor owns it).
        packed_params: elements of quantized packed weights and biases (no ``nn.Parameter``).
        shared_with: index of the first call of the same module, for a repeated call.
        flops: FLOPs charged while this layer ran, at the traced batch.
        uncounted: names of operations that cost FLOPs without a formula (``aten.fft_r2c``).
        module: the module called (None for inputs, merges and the output).
        qualname: the module path the name was made from.
        operand_shapes: a merge's operand shapes (RawShape, then batchless lists).
        param_operands: a merge's operands that are parameters or buffers read in ``forward``
            (see :func:`~.merges.learned_operands`); None for other records.
        traced_shape / traced_dtype: an input tensor's full shape (batch included) and dtype name.
        batch_unknown: once serialised, the shape fields kept whole because their batch axis could
            not be followed (``inputShape``, ``outputShapes.0``, ``inputShapes.1``, ``outputShape``).
    """

    index: int
    type: str
    name: str = ""
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    scope: Optional[str] = None
    sources: Dict[Any, None] = dataclasses.field(default_factory=dict)
    input_shape: Any = None
    output_shapes: List[Any] = dataclasses.field(default_factory=list)
    output_dtype: Optional[str] = None
    output_bytes: int = 0
    own_params: int = 0
    own_buffers: int = 0
    packed_params: int = 0
    shared_with: Optional[int] = None
    flops: int = 0
    uncounted: Set[str] = dataclasses.field(default_factory=set)
    module: Optional[nn.Module] = None
    qualname: str = ""
    operand_shapes: Optional[List[Any]] = None
    param_operands: Optional[List[Dict[str, Any]]] = None
    traced_shape: Optional[List[int]] = None
    traced_dtype: Optional[str] = None
    batch_unknown: List[str] = dataclasses.field(default_factory=list)

    def add_sources(self, keys: frozenset) -> None:
        """Add the record indices in ``keys`` to :attr:`sources`, in :func:`key_order`."""
        if len(keys) == 1:
            for key in keys:
                self.sources.setdefault(key, None)
            return
        for key in sorted(keys, key=key_order):
            self.sources.setdefault(key, None)


@dataclasses.dataclass
class Recording:
    """What one traced forward pass recorded.

    ``records``: inputs first (``input_count`` of them), then layer calls and merges in call order,
    the output last. ``batch_size``: the batch the shapes are stripped of (the first input's first
    dim, or the batch a sequence-first layer revealed). ``functional_flops``: FLOPs of work outside
    every layer; ``functional_uncounted``: op names without a formula there. ``flops_by_kind``:
    every counted FLOP of the pass, inside layers or not, by the kind of operation
    (:func:`neurarch_trace.flops.flop_kind`: ``convolution``, ``matmul``), whatever
    the depth. ``scalars``: the tensor values the forward read into Python (``.item()``,
    ``bool(t)``), in order, for the training-step rehearsal to answer the same questions.
    """

    records: List[LayerCall]
    input_count: int
    batch_size: int
    functional_flops: int
    functional_uncounted: Set[str]
    flops_by_kind: Dict[str, int] = dataclasses.field(default_factory=dict)
    scalars: List[Any] = dataclasses.field(default_factory=list)
