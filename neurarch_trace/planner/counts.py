"""Parameters and forward FLOPs of a graph: measured when the tracer wrote them, estimated otherwise.

The tracer's ``measured`` fields (``docs/measured.md``) are exact: ``measured.params`` counts unique
learnable parameters once however often a module is called, and ``measured.flops`` includes the
functional code between layers (attention matmuls written in a container's ``forward``), which no
per-layer estimate can see. So the totals come from the top-level ``measured`` object whenever it
carries them, per-layer numbers from each component's ``measured`` object, and the formulas of
:mod:`neurarch_trace.planner.estimate` fill in only what is missing, which the plan then says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple

from neurarch_trace.contract import Graph, Node, is_int
from neurarch_trace.planner.estimate import estimate, has_formula, size

__all__ = ["Counts", "LayerCount", "count", "measured_int"]

#: Largest count accepted from a ``measured`` field (2^63, torch's int64 range); larger is garbage.
_MAX_MEASURED = 2**63


def measured_int(obj: Mapping[str, Any], key: str) -> Optional[int]:
    """A non-negative integer ``measured`` field, or ``None`` when absent or malformed."""
    value = obj.get(key)
    if is_int(value) and 0 <= value < _MAX_MEASURED:
        return value
    return None


@dataclass(frozen=True)
class LayerCount:
    """One layer's numbers. ``flops`` is per sample, ``None`` when unknown; the sources are
    ``"measured"``, ``"estimated"`` or ``"unknown"``."""

    node: Node
    params: int
    params_source: str
    flops: Optional[int]
    flops_source: str


@dataclass
class Counts:
    """Totals of a graph. ``flops`` is forward FLOPs per sample at the traced input shape;
    ``exact_params``/``exact_flops`` say whether the tracer's totals were used;
    ``flops_complete`` is false when some operation's FLOPs are unknown (the total is then a
    lower bound); ``unknown`` lists ``(node, reason)`` for layers of unknown cost."""

    params: int
    trainable: int
    frozen: int
    packed: int
    buffer_bytes: int
    flops: int
    exact_params: bool
    exact_flops: bool
    flops_complete: bool
    batch_size: int
    layers: List[LayerCount]
    unknown: List[Tuple[Node, str]] = field(default_factory=list)
    uncounted_ops: List[str] = field(default_factory=list)


def _per_sample(total: int, batch: int) -> int:
    """A count at the traced batch size, divided down to one sample (rounded to whole FLOPs)."""
    return int(round(total / batch)) if batch > 1 else total


def _layer(node: Node, batch: int) -> Tuple[LayerCount, Optional[str]]:
    est = estimate(node)
    m = node.measured
    shared = isinstance(m.get("sharedWith"), str)
    measured_params = measured_int(m, "params")
    if shared:
        params, params_source = 0, "measured"  # the node of the first call owns them
    elif measured_params is not None:
        params, params_source = measured_params, "measured"
    elif est.params is not None:
        params, params_source = est.params, "estimated"
    else:
        params, params_source = 0, "unknown"

    reason = None
    if "flops" in m and m.get("flops") is None:
        flops, flops_source = None, "unknown"
        listed = m.get("uncounted")
        ops = [op for op in listed if isinstance(op, str)] if isinstance(listed, list) else []
        reason = "measured flops null" + (f" ({', '.join(ops[:3])})" if ops else "")
    elif measured_int(m, "flops") is not None:
        flops, flops_source = _per_sample(measured_int(m, "flops") or 0, batch), "measured"
    elif est.flops is not None:
        flops, flops_source = est.flops, "estimated"
    else:
        flops, flops_source = None, "unknown"
        if node.type == "customModule":
            name = node.params.get("className")
            reason = f"customModule {name}" if isinstance(name, str) and name else "customModule"
        elif not has_formula(node.type):
            reason = f"type '{node.type}' has no cost formula" if node.type else "no type"
        else:
            reason = "no shapes to cost it from"
    if params_source == "unknown" and reason is None:
        reason = f"type '{node.type}' has no parameter formula" if node.type else "no type"
    return LayerCount(node, params, params_source, flops, flops_source), reason


def _buffer_bytes_estimate(graph: Graph) -> int:
    """BatchNorm running statistics: running_mean and running_var in float32 (4 bytes) per
    channel plus the int64 num_batches_tracked (8 bytes). Other buffers are not estimated."""
    total = 0
    for node in graph.nodes:
        if node.type == "batchNorm":
            features = size(node.params, "numFeatures") or (node.input_shape[0] if node.input_shape else 0)
            total += 2 * 4 * features + 8
    return total


def count(graph: Graph) -> Counts:
    """Parameters and FLOPs of ``graph``, per layer and in total."""
    top = graph.measured
    batch = measured_int(top, "batchSize") or 1
    layers: List[LayerCount] = []
    unknown: List[Tuple[Node, str]] = []
    for node in graph.nodes:
        if node.type in ("input", "output"):
            continue
        layer, reason = _layer(node, batch)
        layers.append(layer)
        if reason is not None:
            unknown.append((node, reason))

    params = measured_int(top, "params")
    exact_params = params is not None
    if params is None:
        params = sum(layer.params for layer in layers)
    trainable = measured_int(top, "trainableParams")
    if trainable is None or trainable > params:
        trainable = params
    frozen = measured_int(top, "frozenParams")
    if frozen is None or frozen + trainable > params:
        frozen = params - trainable
    packed = measured_int(top, "packedParams") or 0
    buffer_bytes = measured_int(top, "bufferBytes")
    if buffer_bytes is None:
        buffer_bytes = _buffer_bytes_estimate(graph)

    uncounted = top.get("uncountedOps")
    uncounted_ops = [op for op in uncounted if isinstance(op, str)] if isinstance(uncounted, list) else []
    measured_flops = measured_int(top, "flops")
    exact_flops = measured_flops is not None
    if measured_flops is not None:
        flops = _per_sample(measured_flops, batch)
    else:
        flops = sum(layer.flops for layer in layers if layer.flops is not None)
    complete = not uncounted_ops and all(layer.flops is not None for layer in layers)
    return Counts(
        params=params,
        trainable=trainable,
        frozen=frozen,
        packed=packed,
        buffer_bytes=buffer_bytes,
        flops=flops,
        exact_params=exact_params,
        exact_flops=exact_flops,
        flops_complete=complete,
        batch_size=batch,
        layers=layers,
        unknown=unknown,
        uncounted_ops=uncounted_ops,
    )
