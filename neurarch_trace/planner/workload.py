"""What one training sample of a graph is: an image, a sequence of tokens, or something else.

The kind decides the dataset a training cost is quoted for (:mod:`neurarch_trace.planner.cost`)
and whether the request's ``seq_len`` applies. A token model traced at ``L0`` tokens and sized at
``seq_len`` tokens has its per-sample FLOPs and activations scaled by ``seq_len / L0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from neurarch_trace.contract import Graph, Node, numel, parse_shape

__all__ = ["INT_DTYPES", "Workload", "workload"]

#: dtype names (as ``torch`` prints them, with and without the ``torch.`` prefix) of token ids.
INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "long", "int"})

#: Channel counts an image input can have (grey, RGB, RGBA); more channels is not taken as an image.
_MAX_IMAGE_CHANNELS = 4


@dataclass
class Workload:
    """``kind``: ``image``, ``tokens``, ``other`` or ``unknown`` (no input shape).
    ``input_shape``: the first input's batchless shape. ``traced_tokens``: tokens per sample as
    traced (token models). ``seq_len``: tokens per sample the plan sizes for (the request's
    ``seq_len`` for a token model, else the traced count; ``None`` for other kinds).
    ``scale``: ``seq_len / traced_tokens`` (1.0 unless a token model is resized)."""

    kind: str
    input_shape: Optional[Tuple[int, ...]]
    traced_tokens: Optional[int] = None
    seq_len: Optional[int] = None
    scale: float = 1.0
    notes: List[str] = field(default_factory=list)

    @property
    def image_px(self) -> Optional[int]:
        """The smaller side of an image input in pixels; ``None`` for other kinds."""
        if self.kind != "image" or self.input_shape is None:
            return None
        return min(self.input_shape[1], self.input_shape[2])

    def describe(self) -> Optional[str]:
        """How the card says what FLOPs are quoted at: ``3x224x224`` or ``2048 tokens``."""
        if self.kind == "tokens" and self.seq_len is not None:
            return f"{self.seq_len} tokens"
        if self.input_shape:
            return "x".join(str(d) for d in self.input_shape)
        return None


def _dtype_name(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return None
    return value.rsplit(".", 1)[-1].lower()


def _first_input(graph: Graph) -> Tuple[Optional[Node], Optional[Tuple[int, ...]], Optional[str]]:
    """The first input node, its batchless shape and its dtype, from whichever field has them."""
    node = graph.inputs[0] if graph.inputs else None
    shape: Optional[Tuple[int, ...]] = None
    dtype: Optional[str] = None
    if node is not None:
        shape = node.output_shape or parse_shape(node.params.get("shape"))[0]
        dtype = _dtype_name(node.measured.get("outputDtype") or node.measured.get("dtype"))
    inputs = graph.measured.get("inputs")
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict):
        first = inputs[0]
        dtype = dtype or _dtype_name(first.get("dtype"))
        if shape is None:
            full, _ = parse_shape(first.get("shape"))
            if full is not None and len(full) >= 2:
                shape = full[1:]  # measured input shapes carry the batch dim first
    return node, shape, dtype


def workload(graph: Graph, seq_len: Optional[int] = None) -> Workload:
    """Classify the graph's first input and apply ``seq_len`` where it means something."""
    node, shape, dtype = _first_input(graph)
    feeds_embedding = node is not None and any(
        graph.by_id[s].type in ("embedding", "embeddingBag") for s in graph.succs.get(node.id, [])
    )
    if shape is None:
        result = Workload(kind="unknown", input_shape=None)
    elif dtype in INT_DTYPES or (dtype is None and feeds_embedding):
        tokens = numel(shape)
        result = Workload(kind="tokens", input_shape=shape, traced_tokens=tokens, seq_len=tokens)
    elif len(shape) == 3 and shape[0] <= _MAX_IMAGE_CHANNELS:
        result = Workload(kind="image", input_shape=shape)
    else:
        result = Workload(kind="other", input_shape=shape)

    if seq_len is not None:
        if result.kind == "tokens" and result.traced_tokens:
            result.seq_len = seq_len
            result.scale = seq_len / result.traced_tokens
            if seq_len != result.traced_tokens:
                result.notes.append(
                    f"FLOPs and activations scaled from {result.traced_tokens} traced tokens to "
                    f"seq_len {seq_len}, linearly (the attention-score FLOPs grow faster)"
                )
        else:
            result.notes.append("seq_len ignored: the model's input is not a sequence of token ids")
    return result
