"""Progress on stderr for long steps, only when stderr is a terminal.

Building a model, tracing its layers and writing the graph can take tens of seconds on large
configs. When stderr is a terminal a single line is redrawn in place (``building the model``,
``traced 412 layers``, ``writing the graph``); when it is not (a pipe, a file, CI), nothing is
printed. Nothing ever goes to stdout.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """A one-line status on a terminal's stderr; silent elsewhere.

    Use as a context manager; call :meth:`step` with a phase name and the object itself with a
    count of layers traced (it is the tracer's ``progress`` callback).
    """

    def __init__(self, stream: TextIO | None = None, *, min_interval: float = 0.1) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self._stream, "isatty", lambda: False)())
        self._last = 0.0
        self._min_interval = min_interval
        self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.clear()

    def _draw(self, text: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self._min_interval:
            return
        self._last = now
        self._stream.write("\r\033[K" + text)
        self._stream.flush()
        self._shown = True

    def step(self, phase: str) -> None:
        """Show a phase (``building the model``)."""
        self._draw(f"{phase} ...", force=True)

    def __call__(self, layers: int) -> None:
        self._draw(f"traced {layers} layers")

    def clear(self) -> None:
        if self.enabled and self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._shown = False
