"""The ``.neurarch.json`` document: checking it against the contract, reading and writing it.

The public names of :mod:`neurarch_trace.contract`, where the one implementation lives (this module
is kept so that ``neurarch_trace.graph`` stays importable). The contract is
``shared/spec/neurarch-graph.md``; nothing here imports torch.
"""

from __future__ import annotations

from neurarch_trace.contract import (
    check_graph,
    dumps_graph,
    graph_summary,
    layout,
    read_graph,
    validate_graph,
    write_graph,
)

__all__ = [
    "validate_graph",
    "check_graph",
    "read_graph",
    "write_graph",
    "dumps_graph",
    "layout",
    "graph_summary",
]
