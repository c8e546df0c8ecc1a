"""neurarch-trace: trace one forward pass of a PyTorch model into a ``.neurarch.json`` graph.

    >>> import torch, neurarch_trace
    >>> graph = neurarch_trace.trace_model(model, torch.randn(1, 3, 224, 224))
    >>> neurarch_trace.write_graph(graph, "model.neurarch.json")

The core (tracer, mapping, graph) imports no IPython and no HTTP client; ``import neurarch_trace``
itself does not import torch until a tracing function is used, so the plan client stays light.
"""

from __future__ import annotations

from typing import Any

from neurarch_trace._version import __version__
from neurarch_trace.contract import check_graph, read_graph, validate_graph, write_graph
from neurarch_trace.errors import GraphError, InputSpecError, NeurarchError, TargetError, TraceError

__all__ = [
    "__version__",
    "trace_model",
    "write_graph",
    "read_graph",
    "validate_graph",
    "check_graph",
    "request_plan",
    "NeurarchError",
    "GraphError",
    "InputSpecError",
    "TargetError",
    "TraceError",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    # Lazy: torch is imported only when the tracer is used, the HTTP client only when planning.
    if name == "trace_model":
        from neurarch_trace.tracer import trace_model

        return trace_model
    if name == "request_plan":
        from neurarch_trace.plan_client import request_plan

        return request_plan
    raise AttributeError(f"module 'neurarch_trace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext neurarch_trace``: registers the ``%neurarch`` magic (imports IPython lazily)."""
    from neurarch_trace.notebook.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext neurarch_trace``."""
    from neurarch_trace.notebook.magic import unload_ipython_extension as _unload

    _unload(ipython)
