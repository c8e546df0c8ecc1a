"""Whole-model facts the graph carries whatever ``--depth`` is, and the rehearsed training step.

:func:`attach_training` adds to the graph's top-level ``measured``: ``flopsByKind`` (every counted
FLOP of the pass by operation kind, so the planner's utilisation class does not depend on which
layers a depth limit cut off), ``layers`` (the layer count at full depth), ``training`` (the
training step :func:`neurarch_trace.rehearsal.rehearse_training_step` rehearsed) and, for a graph
cut by a depth, ``fullDepth`` (the same call's layers and connections at full depth, each layer
with its type, scope, params, shapes and measured params and bytes: the structure a plan sizes
fine-tuning adapters, activation checkpointing, serving and warnings from); and to each layer node
its ``savedBytes`` (bytes saved for backward while that call ran, at the traced batch), matched by
qualified module name and call order. Field meanings: ``docs/measured.md``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from neurarch_trace.trace.records import Recording

__all__ = ["FULL_DEPTH_MEASURED", "MERGE_TYPES", "attach_training"]

#: Merge nodes are functional code between layers: no module call, so no saved bytes of their own.
MERGE_TYPES = frozenset({"add", "concatenate", "stack"})
#: The per-layer ``measured`` fields ``fullDepth`` keeps (the rest is in the graph's own nodes).
FULL_DEPTH_MEASURED = ("params", "sharedWith", "outputBytes", "outputShapes", "outputDtype", "savedBytes")
_FULL_DEPTH_FIELDS = ("id", "name", "type", "scope", "params", "inputShape", "outputShape")


def _layer_count(graph: Dict[str, Any]) -> int:
    return len([c for c in graph["components"] if c["type"] not in ("input", "output")])


def _structure(full: Dict[str, Any]) -> Dict[str, Any]:
    """The full-depth graph as ``fullDepth`` keeps it: components with their identity, type,
    params, shapes and the measured fields a plan reads; connections as they are."""
    components = []
    for comp in full["components"]:
        kept = {key: comp[key] for key in _FULL_DEPTH_FIELDS if key in comp}
        measured = comp.get("measured", {})
        kept["measured"] = {key: measured[key] for key in FULL_DEPTH_MEASURED if key in measured}
        components.append(kept)
    return {"components": components, "connections": full["connections"],
            "syntheticConnections": full["measured"]["syntheticConnections"]}


def attach_training(graph: Dict[str, Any], recording: Recording, step: Optional[Dict[str, Any]],
                    full: Optional[Dict[str, Any]]) -> None:
    """Add the whole-model facts and ``step`` (the rehearsal's result, or None when none was
    rehearsed) to ``graph`` in place; ``full`` is the same call's graph at full depth when this one
    was cut by a depth (None: this graph is the full one)."""
    top = graph["measured"]
    top["flopsByKind"] = dict(recording.flops_by_kind)
    top["layers"] = _layer_count(full if full is not None else graph)
    if step is not None:
        _attach_step(graph, recording, step)
    if full is not None:
        top["fullDepth"] = _structure(full)


def _attach_step(graph: Dict[str, Any], recording: Recording, step: Dict[str, Any]) -> None:
    top = graph["measured"]
    top["training"] = dict(step["measured"])
    saved = step["savedBytes"]
    calls: Dict[str, int] = {}
    for record, comp in zip(recording.records, graph["components"]):
        if record.type in ("input", "output") or record.type in MERGE_TYPES or record.qualname not in saved:
            continue
        k = calls.get(record.qualname, 0)
        calls[record.qualname] = k + 1
        if k < len(saved[record.qualname]):
            comp["measured"]["savedBytes"] = saved[record.qualname][k]
    if "error" not in top["training"]:
        # the containers no node stands for (decoder layers, ResNet blocks): what each call saved,
        # functional code inside it included, so a plan can size activation checkpointing per block
        top["training"]["scopeSavedBytes"] = {qual: list(saved[qual]) for qual in saved
                                               if qual not in calls and qual != "" and any(saved[qual])}
