"""A read-only, indexed view of a ``.neurarch.json`` document (``shared/spec/neurarch-graph.md``).

:func:`read_graph` rejects only what every reader of the format rejects (a top level that is not an
object, a missing ``components`` or ``connections`` array, a component without a string ``id``) by
raising :class:`~neurarch_trace.errors.GraphError`. Everything else that is wrong (duplicate ids,
dangling connections, malformed shapes) is kept and recorded, so that the verifier can report it
as a blocker that names the layer instead of refusing the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from neurarch_trace.errors import GraphError

__all__ = [
    "MAX_DIM",
    "MAX_NUMEL",
    "MAX_RANK",
    "Edge",
    "Graph",
    "Node",
    "numel",
    "parse_shape",
    "read_graph",
]

#: Largest dimension or size parameter taken as a number (2^40, about 1.1 x 10^12). Larger values
#: describe no tensor that fits on any GPU, and keeping them out keeps every later float finite.
MAX_DIM = 2**40
#: Largest element count of one shape (2^53, the last integer a float64 holds exactly).
MAX_NUMEL = 2**53

Shape = Tuple[int, ...]


def is_int(value: Any) -> bool:
    """True for a JSON integer (``bool`` is an ``int`` subclass in Python but not one here)."""
    return isinstance(value, int) and not isinstance(value, bool)


#: Most dimensions of one shape (PyTorch kernels handle at most 25; 64 leaves room).
MAX_RANK = 64


def numel(shape: Shape) -> int:
    """Elements of a shape: the product of its dimensions (1 for ``()``)."""
    total = 1
    for dim in shape:
        total *= dim
    return total


def _numel_at_most(values: List[int], limit: int) -> bool:
    """Whether the product of ``values`` is at most ``limit``, stopping as soon as it is not (so a
    long list of huge dims never builds a huge integer)."""
    total = 1
    for dim in values:
        total *= dim
        if total > limit:
            return False
    return True


def parse_shape(value: Any) -> Tuple[Optional[Shape], Optional[str]]:
    """``(shape, None)`` for a flat list of positive integers, ``(None, None)`` when absent or
    null (null breaks the format but says nothing false, so it is treated as absent), and
    ``(None, reason)`` for anything else."""
    if value is None:
        return None, None
    if not isinstance(value, list):
        return None, "is not a list"
    if not all(is_int(dim) for dim in value):
        return None, "is not a flat list of integers"
    if any(dim <= 0 for dim in value):
        return None, "has a dimension that is not positive"
    if len(value) > MAX_RANK:
        return None, f"has more than {MAX_RANK} dimensions"
    if any(dim > MAX_DIM for dim in value):
        return None, "has a dimension over 2^40"
    if not _numel_at_most(value, MAX_NUMEL):
        return None, "has more than 2^53 elements"
    return tuple(value), None


@dataclass(frozen=True)
class Node:
    """One component. ``name`` falls back to the id when the component has no string name;
    ``params`` and ``measured`` are ``{}`` when absent or not objects; shapes are ``None`` when
    absent or malformed (the malformation is in :attr:`Graph.problems`)."""

    index: int
    id: str
    name: str
    type: str
    params: Mapping[str, Any]
    input_shape: Optional[Shape]
    output_shape: Optional[Shape]
    scope: Optional[str]
    measured: Mapping[str, Any]

    @property
    def label(self) -> str:
        """How messages name the layer: its name in quotes."""
        return f"'{self.name}'"


@dataclass(frozen=True)
class Edge:
    """A connection whose two ends exist. ``synthetic`` marks the ones the tracer added only to
    keep the graph clean (``measured.syntheticConnections``): they carry no tensor."""

    id: str
    src: str
    dst: str
    synthetic: bool


@dataclass
class Graph:
    """The indexed document. ``nodes`` keeps file order; ``by_id`` maps an id to its first
    component; ``preds``/``succs`` list distinct neighbour ids over real edges; ``problems`` holds
    ``(node or None, sentence)`` for every malformed field found while reading."""

    doc: Mapping[str, Any]
    name: str
    nodes: List[Node]
    by_id: Dict[str, Node]
    edges: List[Edge]
    dangling: List[str] = field(default_factory=list)
    problems: List[Tuple[Optional[Node], str]] = field(default_factory=list)
    preds: Dict[str, List[str]] = field(default_factory=dict)
    succs: Dict[str, List[str]] = field(default_factory=dict)
    measured: Mapping[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> List[Node]:
        """Every component that is not an ``input`` or ``output`` node."""
        return [n for n in self.nodes if n.type not in ("input", "output")]

    @property
    def inputs(self) -> List[Node]:
        """The ``input`` nodes, in file order."""
        return [n for n in self.nodes if n.type == "input"]

    @property
    def outputs(self) -> List[Node]:
        """The ``output`` nodes, in file order."""
        return [n for n in self.nodes if n.type == "output"]

    def real_preds(self, node_id: str) -> List[str]:
        """Distinct producers of ``node_id`` over edges that carry a tensor."""
        return self.preds.get(node_id, [])


def _node(index: int, raw: Mapping[str, Any], problems: List[Tuple[Optional[Node], str]]) -> Node:
    node_id = raw["id"]
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        name = node_id
    node_type = raw.get("type")
    if not isinstance(node_type, str):
        node_type = ""
    params = raw.get("params")
    params_ok = isinstance(params, dict) or params is None
    scope = raw.get("scope")
    measured = raw.get("measured")
    in_shape, in_problem = parse_shape(raw.get("inputShape"))
    out_shape, out_problem = parse_shape(raw.get("outputShape"))
    node = Node(
        index=index,
        id=node_id,
        name=name,
        type=node_type,
        params=params if isinstance(params, dict) else {},
        input_shape=in_shape,
        output_shape=out_shape,
        scope=scope if isinstance(scope, str) else None,
        measured=measured if isinstance(measured, dict) else {},
    )
    if not params_ok:
        problems.append((node, f"{node.label}: params is not an object"))
    if in_problem:
        problems.append((node, f"{node.label}: inputShape {in_problem}"))
    if out_problem:
        problems.append((node, f"{node.label}: outputShape {out_problem}"))
    return node


def read_graph(doc: Any, *, what: str = "model") -> Graph:
    """Index ``doc`` as a graph; ``what`` names it in the error (``model`` or ``base``).

    Raises :class:`GraphError` with one sentence when ``doc`` is not a graph at all.
    """
    if not isinstance(doc, dict):
        raise GraphError(f"{what} is not a graph: it must be a JSON object")
    components = doc.get("components")
    connections = doc.get("connections")
    if not isinstance(components, list) or not isinstance(connections, list):
        raise GraphError(f"{what} is not a graph: it needs 'components' and 'connections' arrays")
    for position, raw in enumerate(components):
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise GraphError(f"{what} is not a graph: component {position} has no string 'id'")

    problems: List[Tuple[Optional[Node], str]] = []
    nodes = [_node(i, raw, problems) for i, raw in enumerate(components)]
    by_id: Dict[str, Node] = {}
    for node in nodes:
        by_id.setdefault(node.id, node)

    measured = doc.get("measured")
    measured = measured if isinstance(measured, dict) else {}
    synthetic_ids = measured.get("syntheticConnections")
    synthetic = {s for s in synthetic_ids if isinstance(s, str)} if isinstance(synthetic_ids, list) else set()

    edges: List[Edge] = []
    dangling: List[str] = []
    # dicts used as insertion-ordered sets: a node with many producers stays linear to index
    pred_sets: Dict[str, Dict[str, None]] = {}
    succ_sets: Dict[str, Dict[str, None]] = {}
    for position, raw in enumerate(connections):
        if not isinstance(raw, dict):
            dangling.append(f"connection {position} is not an object")
            continue
        edge_id = raw.get("id") if isinstance(raw.get("id"), str) else f"#{position}"
        src, dst = raw.get("from"), raw.get("to")
        if not isinstance(src, str) or not isinstance(dst, str):
            dangling.append(f"connection {edge_id} lacks a string 'from' or 'to'")
            continue
        missing = [end for end in (src, dst) if end not in by_id]
        if missing:
            ends = " and ".join(f"'{m}'" for m in missing)
            known = [by_id[end].label for end in (src, dst) if end in by_id]
            where = f" (from {known[0]})" if known and src in by_id else (f" (to {known[0]})" if known else "")
            dangling.append(f"connection {edge_id} points to missing layer {ends}{where}")
            continue
        edge = Edge(id=edge_id, src=src, dst=dst, synthetic=edge_id in synthetic)
        edges.append(edge)
        if edge.synthetic:
            continue
        pred_sets.setdefault(dst, {})[src] = None
        succ_sets.setdefault(src, {})[dst] = None
    preds = {node_id: list(ids) for node_id, ids in pred_sets.items()}
    succs = {node_id: list(ids) for node_id, ids in succ_sets.items()}

    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        name = doc.get("id") if isinstance(doc.get("id"), str) and doc.get("id") else "untitled"
    return Graph(
        doc=doc,
        name=name,
        nodes=nodes,
        by_id=by_id,
        edges=edges,
        dangling=dangling,
        problems=problems,
        preds=preds,
        succs=succs,
        measured=measured,
    )
