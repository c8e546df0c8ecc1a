"""Notebook front end: the ``%neurarch`` magic, its result object and its widget.

    %load_ext neurarch_trace
    %neurarch model --input 1,3,224,224 --plan --share

:mod:`.magic` parses the line with IPython's magic arguments (the trace and plan options come from
:mod:`neurarch_trace.trace_options` and :mod:`neurarch_trace.plan_options`, as the command line's do)
and calls the same target loader, tracer, graph writer and plan client as the command line;
:mod:`.namespace` tells a model expression from a target and turns the magic's ``--input`` values
and model expression into forward arguments (no IPython there); :mod:`.result` holds what comes back
(:class:`NeurarchResult`: graph, path, card, url, plan, error); :mod:`.render` writes it as text and
script-free HTML; :mod:`.widget` is its anywidget view (front end in ``extension/``);
:mod:`.service` runs a plan service on loopback inside the kernel, for notebooks that keep
everything on the machine. Importing this package imports neither IPython, anywidget nor torch;
the names below load on first use.

Imports inside the package go one way: magic -> result -> render, widget -> render; result builds
the widget with a function-level import, and nothing imports magic.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NeurarchResult", "NeurarchWidget", "load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str) -> Any:
    if name == "NeurarchResult":
        from neurarch_trace.notebook.result import NeurarchResult

        return NeurarchResult
    if name == "NeurarchWidget":
        from neurarch_trace.notebook.widget import NeurarchWidget

        return NeurarchWidget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext neurarch_trace.notebook`` (same as ``%load_ext neurarch_trace``)."""
    from neurarch_trace.notebook.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from neurarch_trace.notebook.magic import unload_ipython_extension as _unload

    _unload(ipython)
