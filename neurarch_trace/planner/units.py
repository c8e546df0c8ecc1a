"""The card's number formats: re-exported from :mod:`neurarch_trace.text`, where they live."""

from __future__ import annotations

from neurarch_trace.text import count, duration, flops, gb, signed, usd, usd_delta

__all__ = ["count", "duration", "flops", "gb", "signed", "usd", "usd_delta"]
