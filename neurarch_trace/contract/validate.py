"""The one validator of the clean-graph contract (``shared/spec/neurarch-graph.md``, "A clean graph").

:func:`contract_problems` checks an indexed :class:`~.document.Graph`: unique ids and names, no
dangling connection, an input and an output node, every source an ``input`` and every sink an
``output`` (no dead branch, no orphan), no cycle, and well-formed fields within the limits of
:mod:`.document`. Both sides of the format use it:

* the writer (:func:`validate_graph`, :func:`check_graph`, hence ``write_graph`` and
  ``read_graph(strict=True)``) with ``strict=True``, which also holds a producer to the format's
  letter: every component has a string ``name`` and ``type``, a ``params`` object, and no null shape;
* the plan service's verifier (:mod:`neurarch_trace.planner.verify`) with ``strict=False``, which
  reports each violation as a blocker and lets pass what says nothing false (a null shape is taken as
  absent).

Each :class:`Problem` carries two sentences for one fact: ``message`` names the layer by name, as the
plan's blockers do (``'fc' has no outgoing connection but is not an output (dead branch)``), and
``file_message`` names the component by id, as the writer's errors do (``component 'n3' (linear)
has no outgoing connection but is not an output``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set

from neurarch_trace.contract.document import (
    NOT_FLAT_POSITIVE,
    SHAPE_FIELDS,
    BadConnection,
    BadField,
    Graph,
    Node,
    gc_paused,
    index_graph,
    not_a_graph,
)
from neurarch_trace.contract.order import find_cycle, topological_order
from neurarch_trace.errors import GraphError

__all__ = ["Problem", "check_graph", "contract_problems", "validate_graph"]


@dataclass(frozen=True)
class Problem:
    """One violation: ``code`` (stable: ``duplicate-id``, ``duplicate-name``,
    ``dangling-connection``, ``no-input``, ``no-output``, ``orphan``, ``source-not-input``,
    ``sink-not-output``, ``cycle``, ``malformed-field``, ``format``), ``layer`` (the name of the layer
    to blame, when one is), ``message`` (naming layers by name) and ``file_message`` (naming
    components by id)."""

    code: str
    layer: Optional[str]
    message: str
    file_message: str


def _duplicates(graph: Graph) -> List[Problem]:
    by_id: Dict[str, List[Node]] = {}
    by_name: Dict[str, List[Node]] = {}
    for node in graph.nodes:
        by_id.setdefault(node.id, []).append(node)
        by_name.setdefault(node.name, []).append(node)
    found: List[Problem] = []
    for node_id, nodes in by_id.items():
        if len(nodes) > 1:
            names = " and ".join(n.label for n in nodes[:2])
            found.append(Problem("duplicate-id", nodes[0].name, f"duplicate id '{node_id}' (layers {names})",
                                 f"duplicate component id {node_id!r}"))
    for name, nodes in by_name.items():
        if len(nodes) > 1:
            found.append(Problem("duplicate-name", name, f"duplicate name '{name}' ({len(nodes)} layers)",
                                 f"duplicate component name {name!r}"))
    return found


def _connection(graph: Graph, bad: BadConnection) -> Problem:
    if not isinstance(bad.raw, dict):
        return Problem("dangling-connection", None, f"connection {bad.position} is not an object",
                       f"connection #{bad.position} is not an object")
    label = bad.raw.get("id", f"#{bad.position}")
    file_message = f"connection {label!r} from {bad.src!r} to {bad.dst!r} has an end that does not exist"
    if not bad.missing:
        return Problem("dangling-connection", None, f"connection {bad.edge_id} lacks a string 'from' or 'to'",
                       file_message)
    ends = " and ".join(f"'{m}'" for m in bad.missing)
    known = [graph.by_id[end].label for end in (bad.src, bad.dst) if end in graph.by_id]
    where = f" (from {known[0]})" if known and bad.src in graph.by_id else (f" (to {known[0]})" if known else "")
    return Problem("dangling-connection", None, f"connection {bad.edge_id} points to missing layer {ends}{where}",
                   file_message)


def _end(node: Node, fed: bool, feeds: bool) -> Optional[Problem]:
    """Whether ``node`` is a source or sink of the wrong type, or connected to nothing."""
    where = f"component {node.id!r} ({node.type})"
    no_in = f"{where} has no incoming connection but is not an input"
    no_out = f"{where} has no outgoing connection but is not an output"
    if node.type == "input":
        return None if feeds else Problem("orphan", node.name, f"input {node.label} feeds nothing", no_out)
    if node.type == "output":
        return None if fed else Problem("orphan", node.name, f"output {node.label} is fed by nothing", no_in)
    if not fed and not feeds:
        return Problem("orphan", node.name, f"{node.label} is connected to nothing (orphan)",
                       f"{where} has no incoming and no outgoing connection")
    if not fed:
        return Problem("source-not-input", node.name,
                       f"{node.label} has no incoming connection but is not an input", no_in)
    if not feeds:
        return Problem("sink-not-output", node.name,
                       f"{node.label} has no outgoing connection but is not an output (dead branch)", no_out)
    return None


def _ends(graph: Graph) -> List[Problem]:
    # Sources and sinks over every edge, synthetic ones included: the tracer adds those precisely
    # so that the graph is clean.
    has_in = {edge.dst for edge in graph.edges}
    has_out = {edge.src for edge in graph.edges}
    found: List[Problem] = []
    for code, kind, nodes in (("no-input", "input", graph.inputs), ("no-output", "output", graph.outputs)):
        if not nodes:
            sentence = f"the graph has no {kind} node"
            found.append(Problem(code, None, sentence, sentence))
    for node in graph.by_id.values():
        problem = _end(node, node.id in has_in, node.id in has_out)
        if problem is not None:
            found.append(problem)
    return found


def _cycles(graph: Graph, limit: int = 3) -> List[Problem]:
    """The topological order leaves exactly the nodes on or behind a cycle; walking predecessors
    from any of them must revisit a node, and the loop walked is a cycle. Reports up to ``limit``."""
    pred: Dict[str, Set[str]] = {node_id: set() for node_id in graph.by_id}
    for edge in graph.edges:
        pred[edge.dst].add(edge.src)
    if find_cycle(graph.by_id, pred) is None:
        return []
    stuck = topological_order(graph.by_id, pred).stuck
    position = {node_id: node.index for node_id, node in graph.by_id.items()}
    found: List[Problem] = []
    reported: Set[str] = set()
    for start in sorted(stuck, key=position.__getitem__):
        if len(found) >= limit or start in reported:
            continue
        order: Dict[str, int] = {}
        path: List[str] = []
        node_id = start
        while node_id not in order and node_id not in reported:
            order[node_id] = len(path)
            path.append(node_id)
            node_id = min((p for p in pred[node_id] if p in stuck), key=position.__getitem__)
        reported.update(path)
        if node_id not in order:
            continue  # walked into a loop already reported
        loop = list(reversed(path[order[node_id]:]))  # predecessors walked backwards: flip
        first = min(range(len(loop)), key=lambda i: position[loop[i]])
        loop = loop[first:] + loop[:first]  # start at the loop's first layer in file order
        names = [graph.by_id[i].label for i in loop]
        shown = names if len(names) <= 6 else names[:5] + ["..."]
        found.append(Problem("cycle", graph.by_id[loop[0]].name, "cycle through " + " -> ".join(shown + [names[0]]),
                             f"the connections form a cycle through {', '.join(loop[:5])}"))
    return found


def _field(problem: BadField) -> Problem:
    node = problem.node
    if problem.field == "params":
        file_message = f"component {node.id!r} has no 'params' object"
    elif problem.reason in NOT_FLAT_POSITIVE:
        file_message = (f"component {node.id!r} has {problem.field} {problem.value!r}, "
                        "not a flat list of positive integers")
    else:
        file_message = f"component {node.id!r} has {problem.field} that {problem.reason}"
    return Problem("malformed-field", node.name, f"{node.label}: {problem.field} {problem.reason}", file_message)


def _format_lapses(graph: Graph) -> List[Problem]:
    """What the format's letter requires of a producer though it says nothing false when missing."""
    found: List[Problem] = []
    for node in graph.nodes:
        raw = graph.raw(node)
        for key, word in (("name", "name"), ("type", "type")):
            if not isinstance(raw.get(key), str):
                found.append(Problem("format", node.name, f"{node.label}: {word} is not a string",
                                     f"component {node.id!r} has no string {key!r}"))
        if raw.get("params") is None:
            found.append(Problem("format", node.name, f"{node.label}: params is missing",
                                 f"component {node.id!r} has no 'params' object"))
        for key in SHAPE_FIELDS:
            if key in raw and raw[key] is None:
                found.append(Problem("format", node.name, f"{node.label}: {key} is null",
                                     f"component {node.id!r} has {key} None, not a flat list of positive integers"))
    return found


def contract_problems(graph: Graph, *, strict: bool = False) -> List[Problem]:
    """Every violation of the clean-graph contract in ``graph``, in this order: duplicate ids and
    names, dangling connections, missing input/output nodes, wrong sources and sinks, cycles,
    malformed fields; with ``strict``, then the format's letter (see the module docstring)."""
    found = _duplicates(graph)
    found += [_connection(graph, bad) for bad in graph.bad_connections]
    found += _ends(graph)
    found += _cycles(graph)
    found += [_field(problem) for problem in graph.problems]
    if strict:
        found += _format_lapses(graph)
    return found


def validate_graph(graph: Any, *, max_problems: int = 50) -> List[str]:
    """The contract violations of the document ``graph`` as the writer words them (an empty list
    for a clean graph), at most ``max_problems`` of them: first whether it is a graph at all (an
    object with ``components`` and ``connections`` arrays whose components carry string ids), then
    :func:`contract_problems` with ``strict=True``. Each problem is one sentence naming the
    component by id."""
    fault = not_a_graph(graph)
    if fault is not None:
        return fault.file_sentences[:max_problems]
    with gc_paused():
        problems = contract_problems(index_graph(graph), strict=True)
    return [p.file_message for p in problems][:max_problems]


def check_graph(graph: Any, *, what: str = "the graph") -> dict:
    """Return ``graph`` unchanged if it keeps the contract.

    Raises:
        GraphError: naming the first violation and how many there are.
    """
    problems = validate_graph(graph)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise GraphError(f"{what} is not a valid .neurarch.json graph: {problems[0]}{more}")
    return graph
