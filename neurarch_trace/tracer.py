"""The tracer's public names; the tracer itself is the :mod:`neurarch_trace.trace` package."""

from __future__ import annotations

from neurarch_trace.trace import dtype_name, trace_model, unwrap_model

__all__ = ["trace_model", "unwrap_model", "dtype_name"]
