"""Everything the plan derives from one graph alone, before a card or a base is chosen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Union

from neurarch_trace.contract import Graph, index_graph
from neurarch_trace.errors import GraphError
from neurarch_trace.planner.cost import utilisation
from neurarch_trace.planner.counts import Counts, count, measured_int
from neurarch_trace.planner.lint import lint
from neurarch_trace.planner.memory import MemoryModel, memory_model
from neurarch_trace.planner.verify import Issue, verify
from neurarch_trace.planner.workload import Workload, workload

__all__ = ["Analysis", "analyse"]


@dataclass
class Analysis:
    """A graph with its counts, workload, memory model, blockers and warnings. ``structure`` is
    the model's layers at full depth (the graph's ``measured.fullDepth`` when it was traced with a
    depth limit, else the graph itself): what fine-tuning adapters, activation checkpointing,
    serving and the warnings are sized from, so that ``--depth`` changes no number of the plan."""

    graph: Graph
    counts: Counts
    work: Workload
    memory: MemoryModel
    blockers: List[Issue]
    warnings: List[Issue]
    structure: Optional[Graph] = None
    structure_counts: Optional[Counts] = None

    def __post_init__(self) -> None:
        if self.structure is None:
            self.structure = self.graph
        if self.structure_counts is None:
            self.structure_counts = self.counts

    @property
    def flops_per_sample(self) -> Union[int, float]:
        """Forward FLOPs of one sample at the sized input (scaled for a resized token model: the
        part the tracer measured as growing with the sequence length squared by its square)."""
        if self.work.scale == 1.0:
            return self.counts.flops
        return self.counts.flops * self.work.flops_scale

    @property
    def mfu(self) -> float:
        """The utilisation to price training at (:func:`~neurarch_trace.planner.cost.utilisation`)."""
        return utilisation(self.counts.layers, self.graph.measured.get("flopsByKind"))

    @property
    def layer_count(self) -> int:
        """Layers of the model: the tracer's full-depth count (``measured.layers``, the same at any
        ``--depth``), else the graph's layer nodes."""
        layers = measured_int(self.graph.measured, "layers")
        return layers if layers is not None else len(self.graph.layers)


def analyse(doc: Any, *, what: str = "model", seq_len: Optional[int] = None,
            attention: Optional[str] = None, context: Optional[int] = None) -> Analysis:
    """Read, verify, count and size ``doc``; raises ``GraphError`` when it is not a graph.
    ``context``: the serving context asked, which only the warnings read."""
    graph = index_graph(doc, what=what)
    counts = count(graph)
    work = workload(graph, seq_len)
    structure = full_depth(graph)
    structure_counts = count(structure) if structure is not graph else counts
    return Analysis(
        graph=graph,
        counts=counts,
        work=work,
        memory=memory_model(graph, counts, work, attention),
        blockers=verify(graph),
        warnings=lint(structure, structure_counts, seq_len=work.seq_len if work.kind == "tokens" else None,
                      context=context),
        structure=structure,
        structure_counts=structure_counts,
    )


def full_depth(graph: Graph) -> Graph:
    """The graph's ``measured.fullDepth`` structure as a graph of its own (with the graph's
    top-level ``measured`` totals), or ``graph`` itself when it has none or a malformed one."""
    full = graph.measured.get("fullDepth")
    if not isinstance(full, dict):
        return graph
    measured = {k: v for k, v in graph.measured.items() if k != "fullDepth"}
    measured["syntheticConnections"] = full.get("syntheticConnections", [])
    doc = {"id": graph.doc.get("id"), "name": graph.name, "components": full.get("components"),
           "connections": full.get("connections"), "measured": measured}
    try:
        return index_graph(doc, what="measured.fullDepth")
    except GraphError:
        return graph
