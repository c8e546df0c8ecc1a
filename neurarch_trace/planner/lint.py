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

from collections import deque
from dataclasses import replace
from typing import Dict, List, Optional, Set

from neurarch_trace.planner.counts import Counts, measured_int
from neurarch_trace.planner.estimate import ZERO_COST_TYPES, estimate
from neurarch_trace.planner.graph import Graph, Node
from neurarch_trace.planner.verify import Issue

__all__ = ["DEEP_PLAIN_LAYERS", "lint"]

#: Weight layers on one path from which a net without skip connections is flagged (the issue's
#: "eight or more"; VGG-11 has 8 conv layers, the shallowest plain net of that paper's family).
DEEP_PLAIN_LAYERS = 8

WEIGHT_TYPES = frozenset(
    """linear conv1d conv2d conv3d transposeConv2d depthwiseConv2d patchEmbed lstm gru rnn
    multiHeadAttention groupedQueryAttention transformerBlock feedForward swiglu moeLayer lmHead
    embedding embeddingBag""".split()
)
ACTIVATION_TYPES = frozenset(
    """relu relu6 elu selu gelu swish mish hardSwish hardSigmoid sigmoid tanh leakyRelu prelu
    softplus glu""".split()
)
NORM_TYPES = frozenset({"batchNorm", "layerNorm", "rmsNorm", "groupNorm", "instanceNorm"})
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


def _classifier_warnings(graph: Graph) -> List[Issue]:
    issues: List[Issue] = []
    for node in graph.by_id.values():
        if node.type != "linear" or node.output_shape is None or len(node.output_shape) != 1:
            continue
        # Forward: does it reach an output through parameter-free layers only?
        seen: Set[str] = {node.id}
        queue = deque(graph.succs.get(node.id, []))
        reaches_output = False
        while queue and not reaches_output:
            current = graph.by_id[queue.popleft()]
            if current.id in seen:
                continue
            seen.add(current.id)
            if current.type == "output":
                reaches_output = True
            elif _passive(current):
                queue.extend(graph.succs.get(current.id, []))
        if not reaches_output:
            continue
        # Backward: a dropout between it and the previous weight layer?
        seen = {node.id}
        queue = deque(graph.real_preds(node.id))
        dropout = after_weights = False
        while queue:
            current = graph.by_id[queue.popleft()]
            if current.id in seen:
                continue
            seen.add(current.id)
            if _is_dropout(current):
                dropout = True
                break
            if _passive(current):
                queue.extend(graph.real_preds(current.id))
            elif current.type != "input":
                after_weights = True
        if after_weights and not dropout:
            issues.append(Issue("no-dropout-before-classifier", node.name,
                                f"no dropout before the classifier {node.label}"))
    return issues


def _edge_warnings(graph: Graph) -> List[Issue]:
    issues: List[Issue] = []
    for node in graph.by_id.values():
        producers = graph.real_preds(node.id)
        if len(producers) != 1:
            continue
        producer = graph.by_id[producers[0]]
        if node.type == "batchNorm" and producer.type in _BIASED_TYPES and _has_bias(producer):
            issues.append(Issue("bias-before-batchnorm", producer.name,
                                f"a bias right before a BatchNorm: {producer.label} feeds {node.label}, which cancels it"))
        if node.type in NORM_TYPES and producer.type in ACTIVATION_TYPES:
            issues.append(Issue("norm-after-activation", node.name,
                                f"a norm right after an activation: {node.label} follows {producer.label}"))
    for node in graph.by_id.values():
        if node.type == "softmax" and any(graph.by_id[s].type == "output" for s in graph.succs.get(node.id, [])):
            issues.append(Issue("softmax-at-output", node.name,
                                f"a softmax at the output: {node.label} (CrossEntropyLoss expects logits)"))
    return issues


def _plain_depth(graph: Graph) -> Optional[int]:
    """Most weight layers on one path; ``None`` when the graph has a merge point (a skip path) or
    a cycle."""
    if any(node.type in _MERGE_TYPES for node in graph.nodes):
        return None
    if any(len(graph.real_preds(node_id)) > 1 for node_id in graph.by_id):
        return None
    indegree: Dict[str, int] = {node_id: len(graph.real_preds(node_id)) for node_id in graph.by_id}
    depth: Dict[str, int] = {}
    ready = [node_id for node_id, degree in indegree.items() if degree == 0]
    done = 0
    while ready:
        node_id = ready.pop()
        done += 1
        node = graph.by_id[node_id]
        before = max((depth[p] for p in graph.real_preds(node_id)), default=0)
        depth[node_id] = before + (1 if node.type in WEIGHT_TYPES else 0)
        for nxt in graph.succs.get(node_id, []):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if done != len(graph.by_id):
        return None
    return max(depth.values(), default=0)


def lint(graph: Graph, counts: Counts) -> List[Issue]:
    """Every warning of ``graph``, in the order of the module docstring."""
    issues = _classifier_warnings(graph) + _edge_warnings(graph)
    depth = _plain_depth(graph)
    if depth is not None and depth >= DEEP_PLAIN_LAYERS:
        issues.append(Issue("deep-without-residual", None,
                            f"{depth} weight layers in a row with no residual path"))
    for node, reason in counts.unknown:
        issues.append(Issue("unknown-cost", node.name, f"a layer of unknown cost: {node.label} ({reason})"))
    if counts.uncounted_ops:
        ops = ", ".join(counts.uncounted_ops[:3]) + (", ..." if len(counts.uncounted_ops) > 3 else "")
        issues.append(Issue("unknown-cost", None, f"operations of unknown cost outside layers: {ops}"))
    return issues
