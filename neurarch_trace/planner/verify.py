"""The verifier: would this graph forward-pass? Every violation is a blocker that names the layer.

A graph can be hand-edited, drawn in another tool or written by an older one, so nothing in it is
taken on trust. Three families of checks, in this order:

1. The format contract (``shared/spec/neurarch-graph.md``, "A clean graph"): unique ids and names,
   no dangling connection, no cycle, every source an ``input``, every sink an ``output``, no
   orphans; plus malformed shapes and params found while reading. These come from the contract's
   one validator (:mod:`neurarch_trace.contract.validate`), which the graph writer uses too.
2. Per-type consistency of each layer's params with its own shapes: a linear's ``inFeatures``
   against its input's last dim, a conv's ``inChannels`` against its input channels, norm sizes,
   attention heads dividing the width, query heads divisible by key/value heads, group-norm
   channels divisible by groups, sizes and kernels positive, dropout ``p`` in [0, 1).
3. Shape agreement along edges, deliberately conservative. Traced graphs leave functional code
   (reshapes, slices, splits, concatenations with constants, attention matmuls) out of the graph,
   so a layer's input shape often differs from its producer's output shape in a real, working
   model. A mismatch is a blocker only when it cannot come from such code: the consumer has a
   single producer, the shapes have the same rank and differ in element count, the consumer's
   input is none of the producer's recorded outputs, every dimension agrees except the one the
   consumer's params read (channels for convs and norms, features for linears), and there the
   consumer expects *more* than the producer gives (fewer could be a slice or split, as GPT-2's
   fused ``c_attn`` output feeds ``c_proj``). Merge nodes and multi-producer nodes are not checked.
   A false blocker on a real model is worse than a missed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from neurarch_trace.contract import (
    ATTENTION_TYPES,
    KERNEL_KEYS,
    MAX_DIM,
    MERGE_TYPES,
    POSITIVE_KEYS,
    VOCABULARY,
    Graph,
    Node,
    contract_problems,
    is_int,
    numel,
    parse_shape,
)
from neurarch_trace.planner.estimate import normalized_shape, size

__all__ = ["Issue", "verify"]


@dataclass(frozen=True)
class Issue:
    """One finding: ``code`` (stable, machine-readable), ``layer`` (the layer's name, when one is
    to blame), ``message`` (one sentence that names the layer) and, for a warning, its
    ``severity``."""

    code: str
    layer: Optional[str]
    message: str
    severity: Optional[str] = None  # warnings only: "high", "medium" or "low"

    def as_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"code": self.code, "layer": self.layer, "message": self.message}
        if self.severity is not None:
            out["severity"] = self.severity
        return out


#: The types whose params are checked: the vocabulary less ``customModule``, whose params are the
#: module's own (``className``, ``paramCount``).
CHECKED_TYPES = VOCABULARY - {"customModule"}

#: Which dimension of its input a type's params read: 0 (channels first) or -1 (features last).
READ_DIM: Dict[str, int] = {
    **{t: 0 for t in ("conv1d", "conv2d", "conv3d", "transposeConv2d", "depthwiseConv2d",
                      "patchEmbed", "batchNorm", "groupNorm")},
    **{t: -1 for t in ("linear", "layerNorm", "rmsNorm", "lstm", "gru", "rnn", "multiHeadAttention",
                       "groupedQueryAttention", "transformerBlock", "feedForward", "swiglu",
                       "moeLayer", "lmHead")},
}

_CONV_DIMS = {"conv1d": 1, "conv2d": 2, "conv3d": 3, "transposeConv2d": 2, "depthwiseConv2d": 2}


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _value(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 24 else text[:21] + "..."


# --- 1. the format contract -----------------------------------------------------------------------


def _contract(graph: Graph) -> List[Issue]:
    """The contract's one validator (:func:`neurarch_trace.contract.contract_problems`), as blockers."""
    return [Issue(p.code, p.layer, p.message) for p in contract_problems(graph)]


# --- 2. per-type consistency ----------------------------------------------------------------------


def _positive(value: Any) -> bool:
    return is_int(value) and 1 <= value <= MAX_DIM


def _key_checks(node: Node) -> List[Issue]:
    issues: List[Issue] = []
    p = node.params

    def bad(key: str, rule: str) -> None:
        issues.append(Issue("bad-param", node.name, f"{node.label}: {key} {rule}, not {_value(p[key])}"))

    for key in POSITIVE_KEYS:
        if p.get(key) is not None and not _positive(p[key]):
            bad(key, "must be a positive integer")
    for key in KERNEL_KEYS:
        value = p.get(key)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if not values or not all(_positive(v) for v in values):
            bad(key, "must be a positive integer or a list of them")
    for key in ("padding", "outputPadding"):
        value = p.get(key)
        if value is None or (key == "padding" and value in ("same", "valid")):
            continue
        values = value if isinstance(value, list) else [value]
        if not all(is_int(v) and 0 <= v <= MAX_DIM for v in values):
            bad(key, "must be a non-negative integer or a list of them")
    if p.get("outputSize") is not None:
        value = p["outputSize"]
        values = value if isinstance(value, list) else [value]
        if not values or not all(v is None or _positive(v) for v in values):
            bad("outputSize", "must be a positive integer or a list of them")
    if p.get("scaleFactor") is not None:
        value = p["scaleFactor"]
        values = value if isinstance(value, list) else [value]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not values or len(numbers) != len(values) or not all(0 < v < 1e6 for v in numbers):
            bad("scaleFactor", "must be a positive number")
    if p.get("normalizedShape") is not None and normalized_shape(node) is None:
        bad("normalizedShape", "must be a positive integer or a list of them")
    if node.type == "dropout" and "p" in p:
        value = p["p"]
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
            bad("p", "must be a probability in [0, 1)")
    return issues


def _mismatch(node: Node, key: str, value: Optional[int], what: str, actual: int) -> Optional[Issue]:
    if value is None or value == actual:
        return None
    return Issue("param-shape-mismatch", node.name, f"{node.label}: {key} {value} does not match {what} {actual}")


def _divides(node: Node, whole_key: str, part_key: str, verb: str = "is not divisible by") -> Optional[Issue]:
    whole, part = size(node.params, whole_key), size(node.params, part_key)
    if whole is None or part is None or whole % part == 0:
        return None
    return Issue("not-divisible", node.name, f"{node.label}: {whole_key} {whole} {verb} {part_key} {part}")


def _type_checks(node: Node) -> List[Issue]:
    p, t = node.params, node.type
    found: List[Optional[Issue]] = []
    inp, out = node.input_shape, node.output_shape
    if t == "linear":
        if inp:
            found.append(_mismatch(node, "inFeatures", size(p, "inFeatures"), "its input's last dim", inp[-1]))
        if out:
            found.append(_mismatch(node, "outFeatures", size(p, "outFeatures"), "its output's last dim", out[-1]))
    elif t in _CONV_DIMS:
        channels_first = lambda shape: shape is not None and len(shape) == _CONV_DIMS[t] + 1  # noqa: E731
        if channels_first(inp):
            found.append(_mismatch(node, "inChannels", size(p, "inChannels"), "its input channels", inp[0]))
        if channels_first(out):
            expected = size(p, "outChannels")
            if t == "depthwiseConv2d" and size(p, "inChannels") and size(p, "depthMultiplier", 1):
                expected = size(p, "inChannels") * size(p, "depthMultiplier", 1)  # type: ignore[operator]
                found.append(_mismatch(node, "inChannels x depthMultiplier", expected, "its output channels", out[0]))
            else:
                found.append(_mismatch(node, "outChannels", expected, "its output channels", out[0]))
        if t != "depthwiseConv2d":
            found.append(_divides(node, "inChannels", "groups"))
            found.append(_divides(node, "outChannels", "groups"))
    elif t == "patchEmbed":
        if inp and len(inp) == 3:
            found.append(_mismatch(node, "inChans", size(p, "inChans"), "its input channels", inp[0]))
    elif t == "batchNorm" or (t == "instanceNorm" and p.get("affine") is True):
        if inp:
            found.append(_mismatch(node, "numFeatures", size(p, "numFeatures"), "its input channels", inp[0]))
    elif t == "groupNorm":
        if inp:
            found.append(_mismatch(node, "numChannels", size(p, "numChannels"), "its input channels", inp[0]))
        found.append(_divides(node, "numChannels", "numGroups"))
    elif t in ("layerNorm", "rmsNorm"):
        shape = normalized_shape(node)
        if shape and inp and tuple(inp[-len(shape):]) != shape:
            tail = _fmt(inp[-len(shape):]) if len(inp) >= len(shape) else _fmt(inp)
            found.append(Issue(
                "param-shape-mismatch", node.name,
                f"{node.label}: normalizedShape {_fmt(shape)} does not match its input's trailing dims {tail}"))
    elif t == "multiHeadAttention":
        width_key = "hiddenDim" if "hiddenDim" in p else "embedDim"
        found.append(_divides(node, width_key, "numHeads"))
        if inp:
            found.append(_mismatch(node, width_key, size(p, width_key), "its input's last dim", inp[-1]))
    elif t == "groupedQueryAttention":
        found.append(_divides(node, "embedDim", "numHeads"))
        found.append(_divides(node, "numHeads", "numKVHeads"))
        if inp:
            found.append(_mismatch(node, "embedDim", size(p, "embedDim"), "its input's last dim", inp[-1]))
    elif t in ATTENTION_TYPES:  # transformerBlock and attention containers cut off by depth
        found.append(_divides(node, "embedDim", "numHeads"))
        if t == "transformerBlock" and inp:
            found.append(_mismatch(node, "embedDim", size(p, "embedDim"), "its input's last dim", inp[-1]))
    elif t in ("feedForward", "swiglu", "moeLayer", "lmHead"):
        if inp:
            found.append(_mismatch(node, "embedDim", size(p, "embedDim"), "its input's last dim", inp[-1]))
        if t == "moeLayer":
            top_k, experts = size(p, "topK"), size(p, "numExperts")
            if top_k is not None and experts is not None and top_k > experts:
                found.append(Issue("bad-param", node.name, f"{node.label}: topK {top_k} exceeds numExperts {experts}"))
    elif t in ("embedding", "embeddingBag"):
        if out:
            found.append(_mismatch(node, "embeddingDim", size(p, "embeddingDim"), "its output's last dim", out[-1]))
    elif t in ("lstm", "gru", "rnn"):
        if inp:
            found.append(_mismatch(node, "inputSize", size(p, "inputSize"), "its input's last dim", inp[-1]))
    elif t == "prelu":
        count = size(p, "numParameters")
        if count is not None and count != 1 and inp and count != inp[0]:
            found.append(Issue("param-shape-mismatch", node.name,
                               f"{node.label}: numParameters {count} is neither 1 nor its input channels {inp[0]}"))
    return [issue for issue in found if issue is not None]


# --- 3. shape agreement along edges ---------------------------------------------------------------


def _recorded_outputs(node: Node) -> List[Tuple[int, ...]]:
    shapes = [node.output_shape] if node.output_shape else []
    extra = node.measured.get("outputShapes")
    if isinstance(extra, list):
        for value in extra:
            shape, _ = parse_shape(value)
            if shape is not None:
                shapes.append(shape)
    return shapes


def _edge_checks(graph: Graph) -> List[Issue]:
    issues: List[Issue] = []
    for node in graph.by_id.values():
        read = READ_DIM.get(node.type)
        producers = graph.real_preds(node.id)
        if read is None or node.type in MERGE_TYPES or len(producers) != 1 or node.input_shape is None:
            continue
        producer = graph.by_id[producers[0]]
        outs = _recorded_outputs(producer)
        got = node.input_shape
        if not outs or got in outs:
            continue
        given = outs[0]
        if len(given) != len(got) or numel(given) == numel(got):
            continue  # a reshape, flatten, permute, or a rank change: functional code can do that
        others_agree = all(a == b for i, (a, b) in enumerate(zip(given, got)) if i != read % len(got))
        if others_agree and got[read] > given[read]:
            issues.append(Issue(
                "shape-mismatch", node.name,
                f"{node.label}: inputShape {_fmt(got)} does not match {producer.label}'s outputShape {_fmt(given)}",
            ))
    return issues


def verify(graph: Graph) -> List[Issue]:
    """Every blocker of ``graph``, contract first, then per-layer, then along edges."""
    issues = _contract(graph)
    for node in graph.by_id.values():
        if node.type in CHECKED_TYPES:
            issues.extend(_key_checks(node))
            issues.extend(_type_checks(node))
    issues.extend(_edge_checks(graph))
    return issues
