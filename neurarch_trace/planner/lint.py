"""Warnings: things in a graph that run but train worse, or numbers the plan could not count.

Each rule reads the graph's real edges (synthetic ones carry no tensor) and names the layers it
blames. The plan lists the warnings most severe first (:data:`SEVERITY`; in graph order within a
level), so the card's one line shows the worst. The rules, by severity:

* high, ``beyond-position-table``: the tokens per sample the plan sizes for (``seq_len``, else the
  traced length) or the serving ``context`` exceed the rows of the model's learned position table
  (BERT's 512, GPT-2's 1024): one sequence that long cannot be read (PyTorch raises an index error
  on a real device; the meta device checks no index), and the figures assume it could; packed
  sequences whose position ids restart below the table's rows can. OPT's and BART's tables hold
  2 rows more than their positions, which the graph does not say.
* high, ``softmax-at-output``: a ``softmax`` feeding an output: ``nn.CrossEntropyLoss`` applies
  log-softmax itself and expects logits, so training would apply it twice.
* high, ``deep-without-residual``: eight or more weight layers on one path and no merge point
  anywhere (He et al. 2016, "Deep Residual Learning", show plain nets degrade with depth).
* medium, ``unknown-cost``: a ``customModule``, a type without a formula, or measured FLOPs null:
  the totals miss that layer's cost.
* low, ``bias-before-batchnorm``: a conv or linear with a bias whose only consumer's input is a
  BatchNorm: the norm subtracts the batch mean and cancels the bias, a wasted parameter.
* low, ``norm-after-activation``: a norm fed directly by an activation (the usual order is
  weight, norm, activation).

None of them fires on the canonical architectures (ResNet, ViT, BERT, GPT-2, LLaMA; the tests trace
them). A rule that did, "no dropout before the classifier", is gone: ResNet, ViT and BERT's pooler
have none by design, so it fired on almost every card and hid the warnings that matter.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

from neurarch_trace.contract import (
    ACTIVATION_TYPES,
    NORM_TYPES,
    WEIGHT_TYPES,
    Graph,
    Node,
    topological_order,
)
from neurarch_trace.planner.counts import Counts, measured_int
from neurarch_trace.planner.estimate import estimate
from neurarch_trace.planner.verify import Issue
from neurarch_trace.planner.workload import position_table

__all__ = ["DEEP_PLAIN_LAYERS", "SEVERITY", "lint"]

#: Weight layers on one path from which a net without skip connections is flagged (the issue's
#: "eight or more"; VGG-11 has 8 conv layers, the shallowest plain net of that paper's family).
DEEP_PLAIN_LAYERS = 8

#: Each rule's severity and its rank (lower is listed first).
SEVERITY = {
    "beyond-position-table": (0, "high"),
    "softmax-at-output": (1, "high"),
    "deep-without-residual": (2, "high"),
    "unknown-cost": (3, "medium"),
    "bias-before-batchnorm": (4, "low"),
    "norm-after-activation": (5, "low"),
}

_BIASED_TYPES = frozenset({"linear", "conv1d", "conv2d", "conv3d", "transposeConv2d", "depthwiseConv2d"})
_MERGE_TYPES = frozenset({"add", "concatenate", "stack", "residual"})


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


def _length_warnings(graph: Graph, seq_len: Optional[int], context: Optional[int]) -> List[Issue]:
    """``beyond-position-table`` for a training length ``seq_len`` and a serving ``context`` (tokens
    per sequence; ``None``: not asked) longer than the learned position table."""
    table = position_table(graph)
    if table is None:
        return []
    node, rows = table
    issues = []
    for tokens, what in ((seq_len, "per sample"), (context, "of serving context")):
        if tokens is not None and tokens > rows:
            issues.append(Issue("beyond-position-table", node.name,
                                f"{tokens:,} tokens {what}, but the position table {node.name} has {rows:,} "
                                f"rows: a sequence of more than {rows:,} tokens cannot be read (packed "
                                f"sequences whose position ids restart can)"))
    return issues


def lint(graph: Graph, counts: Counts, *, seq_len: Optional[int] = None,
         context: Optional[int] = None) -> List[Issue]:
    """Every warning of ``graph``, most severe first (see the module docstring), each with its
    ``severity``. ``seq_len``: the tokens per sample the plan sizes a token model for; ``context``:
    the serving context asked (``None``: the model's own)."""
    order = _topological(graph)
    issues = _length_warnings(graph, seq_len, context)
    issues += _edge_warnings(graph)
    depth = _plain_depth(graph, order)
    if depth is not None and depth >= DEEP_PLAIN_LAYERS:
        issues.append(Issue("deep-without-residual", None,
                            f"{depth} weight layers in a row with no residual path"))
    for node, reason in counts.unknown:
        issues.append(Issue("unknown-cost", node.name, f"a layer of unknown cost: {node.label} ({reason})"))
    if counts.uncounted_ops:
        ops = ", ".join(counts.uncounted_ops[:3]) + (", ..." if len(counts.uncounted_ops) > 3 else "")
        issues.append(Issue("unknown-cost", None, f"operations of unknown cost outside layers: {ops}"))
    positions = {node.name: node.index for node in graph.nodes}
    ranked = sorted(enumerate(issues), key=lambda item: (
        SEVERITY[item[1].code][0], positions.get(item[1].layer or "", len(positions)), item[0]))
    return [replace(issue, severity=SEVERITY[issue.code][1]) for _, issue in ranked]
