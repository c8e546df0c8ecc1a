"""The few facts of a graph every front end shows (layers, connections, totals, I/O shapes)."""

from __future__ import annotations

from typing import Any, Dict

__all__ = ["graph_summary", "layer_count"]


def layer_count(graph: Dict[str, Any]) -> int:
    """Components other than ``input`` and ``output`` nodes."""
    return sum(1 for c in graph.get("components", []) if c.get("type") not in ("input", "output"))


def graph_summary(graph: Dict[str, Any]) -> Dict[str, Any]:
    """Counts a front end shows: layers (components other than input/output), connections,
    parameters and FLOPs from ``measured`` when present, and the model's input/output shapes (the
    first input node's ``outputShape`` and the first output node's ``inputShape``, batchless)."""
    comps = graph.get("components", [])
    measured = graph.get("measured") or {}
    first_in = next((c for c in comps if c.get("type") == "input"), None)
    first_out = next((c for c in comps if c.get("type") == "output"), None)
    return {
        "name": graph.get("name"),
        "layers": layer_count(graph),
        "connections": len(graph.get("connections", [])),
        "params": measured.get("params"),
        "flops": measured.get("flops"),
        "batchSize": measured.get("batchSize"),
        "inputShape": first_in.get("outputShape") if first_in else None,
        "outputShape": first_out.get("inputShape") if first_out else None,
    }
