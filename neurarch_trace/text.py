"""How neurarch-trace writes numbers, shapes and messages for people: ``11.7M``, ``1.8 GFLOPs``,
``5.1 GB``, ``$0.60``, ``3x224x224``, ``2 layers``, one-line error text. Presentation only, torch-free
and dependency-free, shared by the planner's card, the command line, the plan client and the notebook;
the data keeps the unrounded numbers."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "count",
    "duration",
    "error_line",
    "flops",
    "gb",
    "install_hint",
    "one_line",
    "plural",
    "printable",
    "shape_text",
    "signed",
    "usd",
    "usd_delta",
    "wait_text",
]

_PREFIXES = ["", "K", "M", "G", "T", "P", "E", "Z", "Y"]


def _scaled(value: float) -> tuple:
    """``(mantissa text, prefix)`` with one decimal, 1 <= mantissa < 1000 after rounding."""
    magnitude = abs(value)
    index = 0
    while magnitude >= 999.95 and index < len(_PREFIXES) - 1:
        magnitude /= 1000
        index += 1
    sign = "-" if value < 0 else ""
    return f"{sign}{magnitude:.1f}", _PREFIXES[index]


def count(value: float) -> str:
    """Parameters: ``812``, ``11.7K``, ``11.7M``, ``6.7B`` (billions, as model names say)."""
    if abs(value) < 1000:
        return f"{value:,.0f}"
    text, prefix = _scaled(value)
    return text + {"G": "B"}.get(prefix, prefix)


def flops(value: float) -> str:
    """FLOPs: ``512 FLOPs``, ``406.5 KFLOPs``, ``1.8 GFLOPs``."""
    if abs(value) < 1000:
        return f"{value:,.0f} FLOPs"
    text, prefix = _scaled(value)
    return f"{text} {prefix}FLOPs"


def gb(num_bytes: float) -> str:
    """Bytes as GB (10^9 bytes): one decimal, two under 0.1 GB."""
    value = num_bytes / 1e9
    return f"{value:.2f} GB" if abs(value) < 0.1 else f"{value:,.1f} GB"


def usd(value: float) -> str:
    """Dollars: ``<$0.01``, ``$0.60``, ``$12.40``, ``$1,234``."""
    if value < 0.005:
        return "<$0.01"
    if value < 100:
        return f"${value:,.2f}"
    return f"${value:,.0f}"


def usd_delta(value: float) -> str:
    """A change in dollars, always with its sign and cents: ``+$0.05``, ``-$1.20``, ``+$1,234``."""
    sign = "-" if value < 0 else "+"
    magnitude = abs(value)
    return f"{sign}${magnitude:,.2f}" if magnitude < 100 else f"{sign}${magnitude:,.0f}"


def duration(seconds: float) -> str:
    """A GPU time: ``42 s``, ``7 min``, ``3.2 h``, ``1,234 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else "<1 s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours < 100 else f"{hours:,.0f} h"


def signed(text: str, value: float) -> str:
    """Prefix a formatted magnitude with ``+`` or ``-`` by the sign of ``value`` (``0`` as is)."""
    if value > 0:
        return "+" + text
    if value < 0:
        return "-" + text.lstrip("-")
    return text


def plural(n: int, word: str) -> str:
    """``1 layer``, ``2 layers``: ``n`` and ``word`` with an ``s`` unless ``n`` is 1."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def shape_text(shape: Any) -> str:
    """``[3, 224, 224]`` -> ``3x224x224`` (the card's way of writing shapes); ``-`` for none,
    ``scalar`` for an empty shape."""
    if not isinstance(shape, (list, tuple)):
        return "-"
    if not shape:
        return "scalar"
    return "x".join(str(d) for d in shape)


def wait_text(seconds: float) -> str:
    """A wait in words, rounded up (for a retry hint): ``45 seconds``, ``12 minutes``, ``3 hours``."""
    if seconds < 120:
        n, unit = math.ceil(seconds), "second"
    elif seconds < 2 * 3600:
        n, unit = math.ceil(seconds / 60), "minute"
    else:
        n, unit = math.ceil(seconds / 3600), "hour"
    return plural(n, unit)


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character (terminal escapes, bells; newlines too unless
    ``keep_newlines``) made a space: names and cards come from graphs and services anyone can
    write, and they are printed to terminals."""
    return "".join(ch if ch.isprintable() or (keep_newlines and ch == "\n") else " " for ch in text)


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with every run of whitespace (newlines included) made one space, cut to ``limit``
    characters with ``...`` when longer."""
    text = " ".join(text.split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return text


#: Characters past which an exception's first line is cut at its first sentence.
LONG_LINE = 160


def error_line(exc: BaseException) -> str:
    """An exception as one line: ``TypeName: first line of its message`` (whitespace collapsed;
    a first line over 160 characters is cut after its first sentence), or ``TypeName`` alone when
    the message is empty."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    first = one_line(lines[0]) if lines else ""
    if len(first) > LONG_LINE and ". " in first:
        first = first.split(". ", 1)[0] + "."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def install_hint(packages: str, extra: str) -> str:
    """How to install what a feature is missing: ``pip install transformers (or pip install -e
    '.[hf]' in the neurarch-trace checkout)``. The extra is named through the checkout, never as
    ``neurarch-trace[hf]``: that PyPI name belongs to an older, unrelated release, whose wheel pip
    would fetch instead."""
    return f"pip install {packages} (or pip install -e '.[{extra}]' in the neurarch-trace checkout)"
