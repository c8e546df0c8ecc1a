"""The record of one node while the trace runs, and the trace's result.

Pure data: the hooks (:mod:`.recorder`) fill records in, :mod:`.serialise` turns them into the
graph's components. Units: shapes in elements per axis, bytes in bytes, FLOPs in floating-point
operations with one multiply-add = 2 FLOPs (``torch.utils.flop_counter``'s convention), parameter
counts in elements.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Any, Dict, List, Optional, Set

from torch import nn

__all__ = ["LayerCall", "Recording", "key_order"]


def key_order(key: Any) -> tuple:
    """Sort key of provenance keys: record indices first, in order, then parameter/buffer names."""
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


_NONE: frozenset = frozenset()


class LayerCall:
    """One node of the graph being recorded: an input, a layer call, a merge, or the output.

    A slotted class, not a dataclass: the hooks make one per layer call, between the model's
    kernels; it holds no container it may never need (``params`` is None until typed, ``uncounted``
    a shared empty frozenset until an operation without a formula runs in it).

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

    __slots__ = (
        "index", "type", "name", "params", "scope", "sources", "input_shape", "output_shapes", "output_dtype",
        "output_bytes", "own_params", "own_buffers", "packed_params", "shared_with", "flops", "uncounted", "module",
        "qualname", "operand_shapes", "param_operands", "traced_shape", "traced_dtype", "batch_unknown",
    )

    def __init__(self, index: int, type: str, name: str = "", module: Optional[nn.Module] = None,
                 qualname: str = "") -> None:
        self.index = index
        self.type = type
        self.name = name
        self.params: Optional[Dict[str, Any]] = None
        self.scope: Optional[str] = None
        self.sources: Dict[Any, None] = {}
        self.input_shape: Any = None
        self.output_shapes: List[Any] = []
        self.output_dtype: Any = None
        self.output_bytes = 0
        self.own_params = 0
        self.own_buffers = 0
        self.packed_params = 0
        self.shared_with: Optional[int] = None
        self.flops = 0
        self.uncounted: AbstractSet[str] = _NONE
        self.module = module
        self.qualname = qualname
        self.operand_shapes: Optional[List[Any]] = None
        self.param_operands: Optional[List[Dict[str, Any]]] = None
        self.traced_shape: Optional[List[int]] = None
        self.traced_dtype: Optional[str] = None
        self.batch_unknown: Optional[List[str]] = None

    def __repr__(self) -> str:
        return f"LayerCall(index={self.index}, type={self.type!r}, name={self.name!r})"

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
    #: the shape a sequence-first layer was fed when it told the batch size (batch on axis 1), or
    #: None when the inputs were read batch first (:class:`~.batch.BatchSize`)
    fed_shape: Optional[tuple] = None
    #: the trace ran on the meta device (a parameter or an input was a meta tensor), whose kernels
    #: check no value: an index past an embedding table raised nothing
    on_meta: bool = False
