"""The library entry points that tie target loading, inputs and the tracer together.

Front ends (the command line, the notebook magic) call these; they know nothing of argparse or
IPython.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from neurarch_trace.inputs import InputSpec, make_inputs
from neurarch_trace.targets import load_target
from neurarch_trace.tracer import dtype_name, trace_model

__all__ = ["trace_target", "describe_inputs"]


def describe_inputs(specs: Sequence[InputSpec], default_dtype: torch.dtype) -> str:
    """``--input 1,3,224,224`` style text of the inputs, for the graph's description."""
    parts = []
    for spec in specs:
        dims = ",".join(str(d) for d in spec.shape)
        dtype = dtype_name(spec.dtype or default_dtype)
        prefix = f"{spec.name}=" if spec.name else ""
        parts.append(f"--input {prefix}{dims}:{dtype}")
    return " ".join(parts)


def trace_target(
    target: str,
    specs: Sequence[InputSpec],
    *,
    default_dtype: torch.dtype = torch.float32,
    name: str | None = None,
    depth: int | None = None,
    device: str = "cpu",
    weights: bool = False,
    hf_class: str = "AutoModel",
    quiet: bool = True,
    progress: Any = None,
) -> tuple[dict, str]:
    """Load ``target``, make seeded random inputs from ``specs`` and trace one forward pass.

    Returns ``(graph, model_name)``. Raises the errors of :func:`load_target`,
    :func:`make_inputs` and :func:`trace_model` (``TargetError``, ``InputSpecError``,
    ``TraceError``).
    """
    if progress is not None:
        progress.step("building the model")
    torch.manual_seed(0)
    loaded = load_target(target, device=device, weights=weights, hf_class=hf_class, quiet=quiet)
    graph_name = name or loaded.name
    graph = trace_module(
        loaded.model,
        specs,
        default_dtype=default_dtype,
        name=graph_name,
        depth=depth,
        device=device,
        description=f"Traced by neurarch-trace from {target} with {describe_inputs(specs, default_dtype)}.",
        progress=progress,
    )
    return graph, loaded.name


def trace_module(
    model: nn.Module,
    specs: Sequence[InputSpec],
    *,
    default_dtype: torch.dtype = torch.float32,
    name: str | None = None,
    depth: int | None = None,
    device: str = "cpu",
    description: str | None = None,
    progress: Any = None,
) -> dict:
    """Trace an already-built ``model`` on random inputs made from ``specs`` (see :mod:`inputs`)."""
    args, kwargs = make_inputs(list(specs), model, default_dtype=default_dtype, device=device)
    if progress is not None:
        progress.step("tracing")
    return trace_model(
        model, args, kwargs=kwargs, name=name, depth=depth, description=description, progress=progress
    )
