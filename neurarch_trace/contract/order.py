"""The one topological order of a graph, from the standard library's :mod:`graphlib`.

Every reader that walks producers before consumers (the validator's cycle check, the layout of a
written graph, the planner's warnings) takes its order from :func:`topological_order`, which also
says which nodes lie on or behind a cycle instead of raising.
"""

from __future__ import annotations

from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from typing import Dict, FrozenSet, Hashable, Iterable, List, Mapping, Optional, Tuple, TypeVar

__all__ = ["Order", "find_cycle", "levels", "topological_order"]

N = TypeVar("N", bound=Hashable)


@dataclass(frozen=True)
class Order:
    """``order``: the nodes producers first (ties in insertion order); ``stuck``: the nodes left
    out because they lie on a cycle or downstream of one (empty for an acyclic graph)."""

    order: Tuple[Hashable, ...]
    stuck: FrozenSet[Hashable]


def topological_order(nodes: Iterable[N], preds: Mapping[N, Iterable[N]]) -> Order:
    """Order ``nodes`` so that every node comes after its predecessors (``preds[node]``; every
    predecessor must be one of ``nodes``). Never raises on a cycle: the nodes it blocks are
    :attr:`Order.stuck`. Linear in nodes plus edges."""
    sorter: TopologicalSorter = TopologicalSorter()
    listed: List[N] = list(nodes)
    for node in listed:
        sorter.add(node, *preds.get(node, ()))
    try:
        sorter.prepare()
    except CycleError:
        pass  # get_ready() still yields every node no cycle blocks
    order: List[N] = []
    while sorter.is_active():
        ready = sorter.get_ready()
        if not ready:
            break
        order.extend(ready)
        sorter.done(*ready)
    placed = set(order)
    return Order(order=tuple(order), stuck=frozenset(n for n in listed if n not in placed))


def find_cycle(nodes: Iterable[N], preds: Mapping[N, Iterable[N]]) -> Optional[List[N]]:
    """One cycle of the graph as ``[a, b, ..., a]`` (each node a predecessor's successor), or None
    when it is acyclic; cheaper than :func:`topological_order` when only that is asked."""
    sorter: TopologicalSorter = TopologicalSorter()
    for node in nodes:
        sorter.add(node, *preds.get(node, ()))
    try:
        sorter.prepare()
    except CycleError as err:
        return list(err.args[1])
    return None


def levels(nodes: Iterable[N], edges: Iterable[Tuple[N, N]]) -> Dict[N, int]:
    """Longest-path depth of each node from the sources: 0 for a source, else one more than its
    deepest producer (a node on or behind a cycle stays at 0)."""
    listed = list(nodes)
    preds: Dict[N, List[N]] = {node: [] for node in listed}
    position = {node: i for i, node in enumerate(listed)}
    forward = True  # every edge from an earlier node to a later one: the listed order is topological
    for src, dst in edges:
        preds[dst].append(src)
        if forward and position[src] >= position[dst]:
            forward = False
    depth: Dict[N, int] = dict.fromkeys(listed, 0)
    # a tracer writes its nodes producers first, so graphlib's pass is needed only for other orders
    for node in listed if forward else topological_order(listed, preds).order:
        for src in preds[node]:
            if depth[src] + 1 > depth[node]:
                depth[node] = depth[src] + 1
    return depth
