"""The ``.neurarch.json`` document, indexed: nodes by id, edges whose ends exist, neighbours.

:func:`index_graph` rejects only what every reader of the format rejects (a top level that is not an
object, a missing ``components`` or ``connections`` array, a component without a string ``id``) by
raising :class:`~neurarch_trace.errors.GraphError`. Everything else that is wrong (duplicate ids,
dangling connections, malformed shapes) is kept and recorded on the :class:`Graph`, so that the
validator (:mod:`.validate`) can report it naming the layer instead of refusing the whole graph.

Limits (one set, for every reader and the writer): a dimension or size at most :data:`MAX_DIM`
(2^40), a shape of at most :data:`MAX_RANK` (64) dimensions and :data:`MAX_NUMEL` (2^53) elements.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from neurarch_trace.errors import GraphError

__all__ = [
    "MAX_DIM",
    "MAX_NUMEL",
    "MAX_RANK",
    "BadConnection",
    "BadField",
    "Edge",
    "Graph",
    "Node",
    "NotAGraph",
    "index_graph",
    "is_int",
    "not_a_graph",
    "numel",
    "parse_shape",
]

#: Largest dimension or size parameter taken as a number (2^40, about 1.1 x 10^12). Larger values
#: describe no tensor that fits on any GPU, and keeping them out keeps every later float finite.
MAX_DIM = 2**40
#: Largest element count of one shape (2^53, the last integer a float64 holds exactly).
MAX_NUMEL = 2**53
#: Most dimensions of one shape (PyTorch kernels handle at most 25; 64 leaves room).
MAX_RANK = 64

Shape = Tuple[int, ...]

#: The shape fields of a component, in the order they are checked.
SHAPE_FIELDS = ("inputShape", "outputShape")


def is_int(value: Any) -> bool:
    """True for a JSON integer (``bool`` is an ``int`` subclass in Python but not one here)."""
    return isinstance(value, int) and not isinstance(value, bool)


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


#: Reasons of :func:`parse_shape` that mean "not a flat list of positive integers".
NOT_FLAT_POSITIVE = frozenset(
    {"is not a list", "is not a flat list of integers", "has a dimension that is not positive"}
)


def parse_shape(value: Any) -> Tuple[Optional[Shape], Optional[str]]:
    """``(shape, None)`` for a flat list of positive integers, ``(None, None)`` when absent or
    null (null breaks the format but says nothing false, so a reader treats it as absent; the
    writer's strict check refuses it), and ``(None, reason)`` for anything else."""
    if value is None:
        return None, None
    if type(value) is list and len(value) <= MAX_RANK:  # the common case, checked in one pass
        total = 1
        for dim in value:
            if type(dim) is not int or not 0 < dim <= MAX_DIM:
                break
            total *= dim
        else:
            if total <= MAX_NUMEL:
                return tuple(value), None
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


# --- what is not a graph at all -------------------------------------------------------------------


@dataclass(frozen=True)
class NotAGraph:
    """Why a document is no graph: ``kind`` is ``not-object``, ``no-arrays`` (``missing`` names the
    arrays) or ``no-id`` (``position`` is the component without a string ``id``)."""

    kind: str
    missing: Tuple[str, ...] = ()
    position: int = -1

    @property
    def sentence(self) -> str:
        """The plan service's wording: ``it needs 'components' and 'connections' arrays``."""
        if self.kind == "not-object":
            return "it must be a JSON object"
        if self.kind == "no-arrays":
            return "it needs 'components' and 'connections' arrays"
        return f"component {self.position} has no string 'id'"

    @property
    def file_sentences(self) -> List[str]:
        """The file reader's and writer's wording, one sentence per fault."""
        if self.kind == "not-object":
            return ["the top level is not a JSON object"]
        if self.kind == "no-arrays":
            return [f"'{name}' is missing or not an array" for name in self.missing]
        return [f"component #{self.position} has no string 'id'"]


def not_a_graph(doc: Any) -> Optional[NotAGraph]:
    """What makes ``doc`` no graph at all, or ``None`` when it is one (it may still break rules)."""
    if not isinstance(doc, dict):
        return NotAGraph("not-object")
    missing = tuple(key for key in ("components", "connections") if not isinstance(doc.get(key), list))
    if missing:
        return NotAGraph("no-arrays", missing=missing)
    for position, raw in enumerate(doc["components"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            return NotAGraph("no-id", position=position)
    return None


# --- the indexed document -------------------------------------------------------------------------


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


@dataclass(frozen=True)
class BadField:
    """A malformed field of a component: ``field`` (``params``, ``inputShape``, ``outputShape``),
    the raw ``value`` and the ``reason`` it is refused (``has a dimension that is not positive``)."""

    node: Node
    field: str
    value: Any
    reason: str


@dataclass(frozen=True)
class BadConnection:
    """A connection that is not an edge: not an object, no string ends, or an end that does not
    exist (``missing`` lists those ends)."""

    position: int
    raw: Any
    edge_id: str
    src: Any = None
    dst: Any = None
    missing: Tuple[str, ...] = ()


@dataclass
class Graph:
    """The indexed document. ``nodes`` keeps file order; ``by_id`` maps an id to its first
    component; ``preds``/``succs`` list distinct neighbour ids over real edges; ``problems`` holds
    every malformed field and ``bad_connections`` every connection that is no edge."""

    doc: Mapping[str, Any]
    name: str
    nodes: List[Node]
    by_id: Dict[str, Node]
    edges: List[Edge]
    bad_connections: List[BadConnection] = field(default_factory=list)
    problems: List[BadField] = field(default_factory=list)
    preds: Dict[str, List[str]] = field(default_factory=dict)
    succs: Dict[str, List[str]] = field(default_factory=dict)
    measured: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, doc: Any, *, what: str = "model") -> Graph:
        """Same as :func:`index_graph`."""
        return index_graph(doc, what=what)

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

    def raw(self, node: Node) -> Mapping[str, Any]:
        """The component object ``node`` was read from."""
        return self.doc["components"][node.index]

    def real_preds(self, node_id: str) -> List[str]:
        """Distinct producers of ``node_id`` over edges that carry a tensor."""
        return self.preds.get(node_id, [])


def _node(index: int, raw: Mapping[str, Any], problems: List[BadField]) -> Node:
    node_id = raw["id"]
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        name = node_id
    node_type = raw.get("type")
    if not isinstance(node_type, str):
        node_type = ""
    params = raw.get("params")
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
    if not (isinstance(params, dict) or params is None):
        problems.append(BadField(node, "params", params, "is not an object"))
    if in_problem:
        problems.append(BadField(node, "inputShape", raw.get("inputShape"), in_problem))
    if out_problem:
        problems.append(BadField(node, "outputShape", raw.get("outputShape"), out_problem))
    return node


def _edges(connections: List[Any], by_id: Mapping[str, Node], synthetic: set) -> Tuple[List[Edge], List[BadConnection]]:
    edges: List[Edge] = []
    bad: List[BadConnection] = []
    for position, raw in enumerate(connections):
        if not isinstance(raw, dict):
            bad.append(BadConnection(position, raw, f"#{position}"))
            continue
        edge_id = raw.get("id") if isinstance(raw.get("id"), str) else f"#{position}"
        src, dst = raw.get("from"), raw.get("to")
        if not isinstance(src, str) or not isinstance(dst, str):
            bad.append(BadConnection(position, raw, edge_id, src, dst))
            continue
        missing = tuple(end for end in (src, dst) if end not in by_id)
        if missing:
            bad.append(BadConnection(position, raw, edge_id, src, dst, missing))
            continue
        edges.append(Edge(id=edge_id, src=src, dst=dst, synthetic=edge_id in synthetic))
    return edges, bad


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection inside the block: indexing makes two small objects per component and
    edge, and each full collection would walk the whole heap (the model, the graph dict) again;
    on a 10,000-node graph that triples the time. Nothing made here needs collecting early."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def index_graph(doc: Any, *, what: str = "model") -> Graph:
    """Index ``doc`` (a loaded ``.neurarch.json`` object) as a :class:`Graph`; ``what`` names it in
    the error (``model`` or ``base``). Linear in components plus connections.

    Raises:
        GraphError: one sentence, when ``doc`` is not a graph at all (:func:`not_a_graph`).
    """
    fault = not_a_graph(doc)
    if fault is not None:
        raise GraphError(f"{what} is not a graph: {fault.sentence}")
    with gc_paused():
        return _index(doc)


def _index(doc: Mapping[str, Any]) -> Graph:
    problems: List[BadField] = []
    nodes = [_node(i, raw, problems) for i, raw in enumerate(doc["components"])]
    by_id: Dict[str, Node] = {}
    for node in nodes:
        by_id.setdefault(node.id, node)

    measured = doc.get("measured")
    measured = measured if isinstance(measured, dict) else {}
    synthetic_ids = measured.get("syntheticConnections")
    synthetic = {s for s in synthetic_ids if isinstance(s, str)} if isinstance(synthetic_ids, list) else set()
    edges, bad = _edges(doc["connections"], by_id, synthetic)

    # dicts used as insertion-ordered sets: a node with many producers stays linear to index
    pred_sets: Dict[str, Dict[str, None]] = {}
    succ_sets: Dict[str, Dict[str, None]] = {}
    for edge in edges:
        if not edge.synthetic:
            pred_sets.setdefault(edge.dst, {})[edge.src] = None
            succ_sets.setdefault(edge.src, {})[edge.dst] = None

    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        name = doc.get("id") if isinstance(doc.get("id"), str) and doc.get("id") else "untitled"
    return Graph(
        doc=doc,
        name=name,
        nodes=nodes,
        by_id=by_id,
        edges=edges,
        bad_connections=bad,
        problems=problems,
        preds={node_id: list(ids) for node_id, ids in pred_sets.items()},
        succs={node_id: list(ids) for node_id, ids in succ_sets.items()},
        measured=measured,
    )
