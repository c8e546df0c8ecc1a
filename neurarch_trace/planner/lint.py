"""Warnings: things in a graph that run but train worse, or numbers the plan could not count.

Each rule reads the graph's real edges (synthetic ones carry no tensor) and names the layers it
blames. The rules, in the order the plan lists them:

* ``no-dropout-before-classifier``: a classifier (a ``linear`` whose per-sample output is a vector,
  reaching an output through parameter-free layers only) with no ``dropout`` (p > 0) between it and
  the previous weight layer.
* ``bias-before-batchnorm``: a conv or linear with a bias whose only consumer's input is a
  BatchNorm: the norm subtracts the batch mean and cancels the bias, a wasted parameter.
* ``norm-after-activation``: a norm fed directly by an activation (the usual order is
  weight, norm, activation).
* ``softmax-at-output``: a ``softmax`` feeding an output: ``nn.CrossEntropyLoss`` applies log-softmax
  itself and expects logits, so training would apply it twice.
* ``deep-without-residual``: eight or more weight layers on one path and no merge point anywhere
  (He et al. 2016, "Deep Residual Learning", show plain nets degrade with depth).
* ``unknown-cost``: a ``customModule``, a type without a formula, or measured FLOPs null: the totals
  miss that layer's cost.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Set, Tuple

from neurarch_trace.contract import (
    ACTIVATION_TYPES,
    NORM_TYPES,
    WEIGHT_TYPES,
    ZERO_COST_TYPES,
    Graph,
    Node,
    topological_order,
)
from neurarch_trace.planner.counts import Counts, measured_int
from neurarch_trace.planner.estimate import estimate
from neurarch_trace.planner.verify import Issue

__all__ = ["DEEP_PLAIN_LAYERS", "lint"]

#: Weight layers on one path from which a net without skip connections is flagged (the issue's
#: "eight or more"; VGG-11 has 8 conv layers, the shallowest plain net of that paper's family).
DEEP_PLAIN_LAYERS = 8

_BIASED_TYPES = frozenset({"linear", "conv1d", "conv2d", "conv3d", "transposeConv2d", "depthwiseConv2d"})
_MERGE_TYPES = frozenset({"add", "concatenate", "stack", "residual"})


def _passive(node: Node) -> bool:
    """Parameter-free and free of counted FLOPs: activations, dropout, flatten, pooling."""
    return node.type in ZERO_COST_TYPES and node.type not in ("input", "output")


def _is_dropout(node: Node) -> bool:
    p = node.params.get("p")
    return node.type == "dropout" and not (isinstance(p, (int, float)) and p == 0)


def _has_bias(node: Node) -> bool:
    """The ``bias`` key when it is a bool; else, when the tracer measured the layer, whether its
    parameter count exceeds the bias-free formula; else PyTorch's default (a bias)."""
    flag = node.params.get("bias")
    if isinstance(flag, bool):
        return flag
    measured = measured_int(node.measured, "params")
    if measured is not None:
        without = estimate(replace(node, params={**node.params, "bias": False})).params
        return without is None or measured != without
    return True


def _topological(graph: Graph) -> List[str]:
    """Node ids producers first over real edges (the contract's one topological order); nodes on or
    behind a cycle are left out."""
    return list(topological_order(graph.by_id, graph.preds).order)


def _classifier_warnings(graph: Graph, order: List[str]) -> List[Issue]:
    """One pass each way over the topological order, so the rule stays linear in the graph's
    size however many classifiers share a long chain of parameter-free layers."""
    # Forward facts, producers first: for a parameter-free node, is there a dropout / a weight
    # layer among its ancestors reached through parameter-free nodes only?
    dropout_behind: Dict[str, bool] = {}
    weights_behind: Dict[str, bool] = {}

    def behind(node_id: str) -> Tuple[bool, bool]:
        has_dropout = has_weights = False
        for pred_id in graph.real_preds(node_id):
            pred = graph.by_id[pred_id]
            if _passive(pred):
                has_dropout = has_dropout or _is_dropout(pred) or dropout_behind.get(pred_id, False)
                has_weights = has_weights or weights_behind.get(pred_id, False)
            elif pred.type != "input":
                has_weights = True
        return has_dropout, has_weights

    for node_id in order:
        if _passive(graph.by_id[node_id]):
            dropout_behind[node_id], weights_behind[node_id] = behind(node_id)
    # Backward facts, consumers first: does a node reach an output through parameter-free nodes?
    reaches_output: Set[str] = set()
    for node_id in reversed(order):
        node = graph.by_id[node_id]
        succs = graph.succs.get(node_id, [])
        if node.type == "output" or (_passive(node) and any(s in reaches_output for s in succs)):
            reaches_output.add(node_id)

    issues: List[Issue] = []
    for node_id in order:
        node = graph.by_id[node_id]
        if node.type != "linear" or node.output_shape is None or len(node.output_shape) != 1:
            continue
        if not any(s in reaches_output for s in graph.succs.get(node_id, [])):
            continue
        has_dropout, has_weights = behind(node_id)
        if has_weights and not has_dropout:
            issues.append(Issue("no-dropout-before-classifier", node.name,
                                f"no dropout before the classifier {node.label}"))
    positions = {node.name: node.index for node in graph.nodes}
    issues.sort(key=lambda issue: positions.get(issue.layer or "", 0))
    return issues


def _edge_warnings(graph: Graph) -> List[Issue]:
    issues: List[Issue] = []
    for node in graph.by_id.values():
        producers = graph.real_preds(node.id)
        if len(producers) != 1:
            continue
        producer = graph.by_id[producers[0]]
        if node.type == "batchNorm" and producer.type in _BIASED_TYPES and _has_bias(producer):
            issues.append(Issue(
                "bias-before-batchnorm", producer.name,
                f"a bias right before a BatchNorm: {producer.label} feeds {node.label}, which cancels it"))
        if node.type in NORM_TYPES and producer.type in ACTIVATION_TYPES:
            issues.append(Issue("norm-after-activation", node.name,
                                f"a norm right after an activation: {node.label} follows {producer.label}"))
    for node in graph.by_id.values():
        if node.type == "softmax" and any(graph.by_id[s].type == "output" for s in graph.succs.get(node.id, [])):
            issues.append(Issue("softmax-at-output", node.name,
                                f"a softmax at the output: {node.label} (CrossEntropyLoss expects logits)"))
    return issues


def _plain_depth(graph: Graph, order: List[str]) -> Optional[int]:
    """Most weight layers on one path; ``None`` when the graph has a merge point (a skip path) or
    a cycle."""
    if any(node.type in _MERGE_TYPES for node in graph.nodes):
        return None
    if any(len(graph.real_preds(node_id)) > 1 for node_id in graph.by_id):
        return None
    if len(order) != len(graph.by_id):
        return None
    depth: Dict[str, int] = {}
    for node_id in order:
        before = max((depth[p] for p in graph.real_preds(node_id)), default=0)
        depth[node_id] = before + (1 if graph.by_id[node_id].type in WEIGHT_TYPES else 0)
    return max(depth.values(), default=0)


def lint(graph: Graph, counts: Counts) -> List[Issue]:
    """Every warning of ``graph``, in the order of the module docstring."""
    order = _topological(graph)
    issues = _classifier_warnings(graph, order) + _edge_warnings(graph)
    depth = _plain_depth(graph, order)
    if depth is not None and depth >= DEEP_PLAIN_LAYERS:
        issues.append(Issue("deep-without-residual", None,
                            f"{depth} weight layers in a row with no residual path"))
    for node, reason in counts.unknown:
        issues.append(Issue("unknown-cost", node.name, f"a layer of unknown cost: {node.label} ({reason})"))
    if counts.uncounted_ops:
        ops = ", ".join(counts.uncounted_ops[:3]) + (", ..." if len(counts.uncounted_ops) > 3 else "")
        issues.append(Issue("unknown-cost", None, f"operations of unknown cost outside layers: {ops}"))
    return issues
