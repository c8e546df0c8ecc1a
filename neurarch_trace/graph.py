"""The ``.neurarch.json`` document: checking it against the contract, reading and writing it.

The contract is ``shared/spec/neurarch-graph.md``: a JSON object with ``id``, ``name``,
``description``, ``components`` and ``connections``; unique component ids and names; connections
whose ends exist; no cycle; every node without an incoming edge typed ``input`` and every node
without an outgoing edge typed ``output``; shapes flat lists of positive integers (batch dimension
stripped). This module imports no torch, so the plan client and the plan service can use it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections import deque
from typing import Any, Iterable

from neurarch_trace.errors import GraphError

__all__ = [
    "validate_graph",
    "check_graph",
    "read_graph",
    "write_graph",
    "dumps_graph",
    "layout",
    "graph_summary",
]

_SHAPE_FIELDS = ("inputShape", "outputShape")


def _is_shape(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value
    )


def validate_graph(graph: Any, *, max_problems: int = 50) -> list[str]:
    """Return the contract violations of ``graph`` (an empty list for a clean graph).

    Checks, in this order: the document shape (an object with ``components`` and ``connections``
    arrays, each component an object with a string ``id``), unique ids and names, a ``params``
    object and a string ``type`` on every component, shapes that are flat lists of positive
    integers, connections whose ``from``/``to`` exist, no cycle, sources typed ``input`` and sinks
    typed ``output``. Each problem is one sentence naming the component. At most ``max_problems``
    are returned.
    """
    problems: list[str] = []
    if not isinstance(graph, dict):
        return ["the top level is not a JSON object"]
    comps = graph.get("components")
    conns = graph.get("connections")
    if not isinstance(comps, list):
        problems.append("'components' is missing or not an array")
    if not isinstance(conns, list):
        problems.append("'connections' is missing or not an array")
    if problems:
        return problems
    ids: set[str] = set()
    names: set[str] = set()
    types: dict[str, str] = {}
    for i, comp in enumerate(comps):
        if not isinstance(comp, dict) or not isinstance(comp.get("id"), str):
            problems.append(f"component #{i} has no string 'id'")
            continue
        cid = comp["id"]
        if cid in ids:
            problems.append(f"duplicate component id {cid!r}")
        ids.add(cid)
        name = comp.get("name")
        if not isinstance(name, str):
            problems.append(f"component {cid!r} has no string 'name'")
        elif name in names:
            problems.append(f"duplicate component name {name!r}")
        else:
            names.add(name)
        ctype = comp.get("type")
        if not isinstance(ctype, str):
            problems.append(f"component {cid!r} has no string 'type'")
        else:
            types[cid] = ctype
        if not isinstance(comp.get("params"), dict):
            problems.append(f"component {cid!r} has no 'params' object")
        for field in _SHAPE_FIELDS:
            if field in comp and not _is_shape(comp[field]):
                problems.append(
                    f"component {cid!r} has {field} {comp[field]!r}, not a flat list of positive integers"
                )
        if len(problems) >= max_problems:
            return problems[:max_problems]
    succ: dict[str, list[str]] = {cid: [] for cid in ids}
    indeg: dict[str, int] = {cid: 0 for cid in ids}
    for i, conn in enumerate(conns):
        if not isinstance(conn, dict):
            problems.append(f"connection #{i} is not an object")
            continue
        src, dst = conn.get("from"), conn.get("to")
        label = conn.get("id", f"#{i}")
        if src not in ids or dst not in ids:
            problems.append(f"connection {label!r} from {src!r} to {dst!r} has an end that does not exist")
            continue
        succ[src].append(dst)
        indeg[dst] += 1
    # Kahn's algorithm: what is left over lies on a cycle.
    queue = deque(cid for cid, d in indeg.items() if d == 0)
    remaining = dict(indeg)
    seen = 0
    while queue:
        cid = queue.popleft()
        seen += 1
        for nxt in succ[cid]:
            remaining[nxt] -= 1
            if remaining[nxt] == 0:
                queue.append(nxt)
    if seen < len(ids):
        on_cycle = sorted(cid for cid, d in remaining.items() if d > 0)
        problems.append(f"the connections form a cycle through {', '.join(on_cycle[:5])}")
    for cid in sorted(ids):
        ctype = types.get(cid)
        if indeg[cid] == 0 and ctype != "input":
            problems.append(f"component {cid!r} ({ctype}) has no incoming connection but is not an input")
        if not succ[cid] and ctype != "output":
            problems.append(f"component {cid!r} ({ctype}) has no outgoing connection but is not an output")
        if len(problems) >= max_problems:
            break
    return problems[:max_problems]


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


def read_graph(path: str | os.PathLike[str], *, strict: bool = False) -> dict:
    """Read a ``.neurarch.json`` file.

    The document must be a graph (an object with ``components`` and ``connections`` arrays whose
    components carry string ids). With ``strict=True`` the whole clean-graph contract is enforced
    (see :func:`validate_graph`); otherwise a graph with, say, a dead branch is still returned, so a
    plan service can report it as a blocker.

    Raises:
        GraphError: the file is missing or unreadable, is not JSON, or is not a graph.
    """
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise GraphError(f"graph file {p} does not exist") from None
    except IsADirectoryError:
        raise GraphError(f"graph file {p} is a directory, not a .neurarch.json file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GraphError(f"cannot read graph file {p}: {exc}") from exc
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(f"graph file {p} is not JSON ({exc.msg} at line {exc.lineno})") from exc
    if strict:
        return check_graph(graph, what=f"graph file {p}")
    structural = [
        prob
        for prob in validate_graph(graph)
        if "not a JSON object" in prob or "missing or not an array" in prob or "no string 'id'" in prob
    ]
    if structural:
        raise GraphError(f"graph file {p} is not a .neurarch.json graph: {structural[0]}")
    return graph


def dumps_graph(graph: dict) -> str:
    """Serialise a graph deterministically (key order as built, two-space indent, final newline)."""
    return json.dumps(graph, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_graph(graph: dict, path: str | os.PathLike[str], *, validate: bool = True) -> str:
    """Write ``graph`` to ``path`` atomically and return the path written.

    The text goes to a temporary file in the same folder, is flushed to disk, then renamed over
    ``path``: a failure never leaves a partial file and never clobbers an earlier good one.

    Raises:
        GraphError: ``validate`` is true and the graph breaks the contract (nothing is written).
        OSError: the folder does not exist or is not writable; ``str()`` names ``path``.
    """
    if validate:
        check_graph(graph)
    text = dumps_graph(graph)
    p = os.fspath(path)
    target = os.path.realpath(p)  # writing through a symbolic link updates the file it points to
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise OSError(errno.ENOENT, f"cannot write {p}: folder {folder} does not exist")
    if os.path.isdir(target):
        raise OSError(errno.EISDIR, f"cannot write {p}: it is a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".neurarch-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {p}: {exc.strerror} (folder {folder})") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def layout(component_ids: list[str], edges: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """Place components in rows by longest path from the sources: ``{id: {"x": px, "y": px}}``.

    Rows are 100 px apart, siblings in a row 240 px apart. Linear in nodes plus edges; the input
    order is kept within a row, so the layout is deterministic.
    """
    succ: dict[str, list[str]] = {cid: [] for cid in component_ids}
    indeg = {cid: 0 for cid in component_ids}
    for src, dst in edges:
        succ[src].append(dst)
        indeg[dst] += 1
    level = {cid: 0 for cid in component_ids}
    queue = deque(cid for cid in component_ids if indeg[cid] == 0)
    while queue:
        cid = queue.popleft()
        for nxt in succ[cid]:
            if level[cid] + 1 > level[nxt]:
                level[nxt] = level[cid] + 1
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                queue.append(nxt)
    column: dict[int, int] = {}
    pos: dict[str, dict[str, int]] = {}
    for cid in component_ids:
        row = level[cid]
        col = column.get(row, 0)
        column[row] = col + 1
        pos[cid] = {"x": col * 240, "y": row * 100}
    return pos


def graph_summary(graph: dict) -> dict[str, Any]:
    """Counts a front end shows: layers (components other than input/output), connections,
    parameters and FLOPs from ``measured`` when present, and the model's input/output shapes."""
    comps = graph.get("components", [])
    layers = [c for c in comps if c.get("type") not in ("input", "output")]
    measured = graph.get("measured") or {}
    first_in = next((c for c in comps if c.get("type") == "input"), None)
    first_out = next((c for c in comps if c.get("type") == "output"), None)
    return {
        "name": graph.get("name"),
        "layers": len(layers),
        "connections": len(graph.get("connections", [])),
        "params": measured.get("params"),
        "flops": measured.get("flops"),
        "batchSize": measured.get("batchSize"),
        "inputShape": first_in.get("outputShape") if first_in else None,
        "outputShape": first_out.get("inputShape") if first_out else None,
    }
