"""The ``.neurarch.json`` contract (``shared/spec/neurarch-graph.md``), torch-free.

One place for everything the format says, shared by the tracer (which writes it), the plan client
and the planner (which read it)::

    vocabulary   the types and their parameter keys, and the type families the rules read
    document     the indexed document: Graph, Node, Edge; index_graph(doc); shape limits
    order        the one topological order (graphlib)
    validate     the one validator: contract_problems(graph), validate_graph(doc), check_graph(doc)
    files        the one reader and writer: read_graph(path), write_graph(graph, path)
    layout       component positions for a written graph
    summary      the counts front ends show

This package imports nothing outside the standard library and :mod:`neurarch_trace.errors`.
"""

from __future__ import annotations

from neurarch_trace.contract.document import (
    MAX_DIM,
    MAX_NUMEL,
    MAX_RANK,
    Edge,
    Graph,
    Node,
    NotAGraph,
    index_graph,
    is_int,
    not_a_graph,
    numel,
    parse_shape,
)
from neurarch_trace.contract.files import (
    check_output_path,
    default_graph_path,
    dumps_graph,
    named_graph_path,
    read_graph,
    unwritable_folder,
    write_error,
    write_graph,
)
from neurarch_trace.contract.layout import layout
from neurarch_trace.contract.order import Order, find_cycle, levels, topological_order
from neurarch_trace.contract.summary import graph_summary, layer_count
from neurarch_trace.contract.validate import Problem, check_graph, contract_problems, validate_graph
from neurarch_trace.contract.vocabulary import (
    ACTIVATION_TYPES,
    ATTENTION_TYPES,
    CONV_TYPES,
    KERNEL_KEYS,
    MERGE_TYPES,
    NORM_TYPES,
    POSITIVE_KEYS,
    TYPES,
    VOCABULARY,
    WEIGHT_TYPES,
    ZERO_COST_TYPES,
    check_type,
)

__all__ = [
    "ACTIVATION_TYPES",
    "ATTENTION_TYPES",
    "CONV_TYPES",
    "KERNEL_KEYS",
    "MAX_DIM",
    "MAX_NUMEL",
    "MAX_RANK",
    "MERGE_TYPES",
    "NORM_TYPES",
    "POSITIVE_KEYS",
    "TYPES",
    "VOCABULARY",
    "WEIGHT_TYPES",
    "ZERO_COST_TYPES",
    "Edge",
    "Graph",
    "Node",
    "NotAGraph",
    "Order",
    "Problem",
    "check_graph",
    "check_output_path",
    "check_type",
    "contract_problems",
    "default_graph_path",
    "named_graph_path",
    "dumps_graph",
    "find_cycle",
    "graph_summary",
    "index_graph",
    "is_int",
    "layer_count",
    "layout",
    "levels",
    "not_a_graph",
    "numel",
    "parse_shape",
    "read_graph",
    "topological_order",
    "unwritable_folder",
    "validate_graph",
    "write_error",
    "write_graph",
]
