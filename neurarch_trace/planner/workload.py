"""What one training sample of a graph is: an image, a sequence of tokens, or something else.

The kind decides the dataset a training cost is quoted for (:mod:`neurarch_trace.planner.cost`)
and whether the request's ``seq_len`` applies. A token model traced at ``L0`` tokens and sized at
``seq_len`` tokens has its per-sample FLOPs and activations scaled by ``r = seq_len / L0``; where
the tracer measured which part grows with the sequence length squared (attention scores:
``measured.training.flopsSeqSquaredFraction`` for FLOPs, ``seqSquaredBytes`` for memory), that
part is scaled by ``r^2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from neurarch_trace.contract import Graph, Node, numel, parse_shape
from neurarch_trace.planner.estimate import size

__all__ = ["INT_DTYPES", "Workload", "position_table", "workload"]

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
    ``scale``: ``seq_len / traced_tokens`` (1.0 unless a token model is resized).
    ``flops_squared``: the fraction of the traced FLOPs that grows with ``seq_len^2`` (measured;
    0 when unknown, which scales all FLOPs linearly)."""

    kind: str
    input_shape: tuple[int, ...] | None
    traced_tokens: int | None = None
    seq_len: int | None = None
    scale: float = 1.0
    flops_squared: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def flops_scale(self) -> float:
        """Forward FLOPs at ``seq_len`` over FLOPs as traced: ``(1 - q) r + q r^2``."""
        q = self.flops_squared
        return (1.0 - q) * self.scale + q * self.scale * self.scale

    @property
    def image_px(self) -> int | None:
        """The smaller side of an image input in pixels; ``None`` for other kinds."""
        if self.kind != "image" or self.input_shape is None:
            return None
        return min(self.input_shape[1], self.input_shape[2])

    def describe(self) -> str | None:
        """How the card says what FLOPs are quoted at: ``3x224x224`` or ``2,048 tokens`` (thousands
        separated, as the serving line's context is)."""
        if self.kind == "tokens" and self.seq_len is not None:
            return f"{self.seq_len:,} token{'' if self.seq_len == 1 else 's'}"
        if self.input_shape:
            return "x".join(str(d) for d in self.input_shape)
        return None


def _dtype_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value.rsplit(".", 1)[-1].lower()


def _first_input(graph: Graph) -> tuple[Node | None, tuple[int, ...] | None, str | None]:
    """The first input node, its batchless shape and its dtype, from whichever field has them."""
    node = graph.inputs[0] if graph.inputs else None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
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


def _training(graph: Graph) -> dict:
    training = graph.measured.get("training")
    return training if isinstance(training, dict) and "error" not in training else {}


def _flops_squared(graph: Graph) -> float:
    value = _training(graph).get("flopsSeqSquaredFraction")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return min(max(float(value), 0.0), 1.0)
    return 0.0


def _measured_squares(graph: Graph) -> bool:
    training = _training(graph)
    tokens = training.get("tokens")
    return isinstance(tokens, list) and len(tokens) == 2 and "flopsSeqSquaredFraction" in training


def workload(graph: Graph, seq_len: int | None = None) -> Workload:
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
            result.flops_squared = _flops_squared(graph)
            if seq_len != result.traced_tokens:
                how = ("linear terms by the ratio, the measured attention terms by its square"
                       if _measured_squares(graph) else "linearly (the attention-score terms grow faster)")
                result.notes.append(
                    f"FLOPs and activations scaled from {result.traced_tokens} traced tokens to "
                    f"seq_len {seq_len}, {how}"
                )
        else:
            result.notes.append("seq_len ignored: the model's input is not a sequence of token ids")
    return result


def position_table(graph: Graph) -> tuple[Node, int] | None:
    """The learned position table of a token model and its rows, the most tokens it can read: the
    first ``embedding`` layer named ``wpe`` (GPT-2) or ``*position*`` (BERT's
    ``position_embeddings``, OPT's ``embed_positions``), its ``vocabSize``. ``None`` when there is
    none: rotary (LLaMA) and relative (T5) positions set no such limit."""
    for node in graph.layers:
        leaf = node.name.rsplit(".", 1)[-1].split("#")[0].lower()
        if node.type == "embedding" and (leaf == "wpe" or "position" in leaf):
            rows = size(node.params, "vocabSize")
            if rows:
                return node, rows
    return None
