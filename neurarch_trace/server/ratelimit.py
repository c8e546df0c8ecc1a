"""Per-client rate limiting: at most ``limit`` calls in any ``window`` seconds (a sliding log).

Each key (a client IP) keeps the times of its calls inside the window, at most ``limit`` of them,
so memory is bounded by the clients active in one window. When a call is refused, the answer
says how many whole seconds until the oldest call leaves the window (``Retry-After``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, Optional

__all__ = ["RateLimiter"]

#: Calls between sweeps that forget clients whose calls have all left the window.
_SWEEP_EVERY = 1024


class RateLimiter:
    """``hit(key)`` records a call and returns ``None``, or refuses it and returns the seconds to
    wait. A ``limit`` of 0 means no limit."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._calls: Dict[str, Deque[float]] = {}
        self._lock = threading.Lock()
        self._since_sweep = 0

    def hit(self, key: str) -> Optional[int]:
        if self.limit <= 0:
            return None
        now = self._clock()
        horizon = now - self.window_s
        with self._lock:
            self._since_sweep += 1
            if self._since_sweep >= _SWEEP_EVERY:
                self._sweep(horizon)
            calls = self._calls.setdefault(key, deque())
            while calls and calls[0] <= horizon:
                calls.popleft()
            if len(calls) >= self.limit:
                return max(1, math.ceil(calls[0] + self.window_s - now))
            calls.append(now)
            return None

    def _sweep(self, horizon: float) -> None:
        self._since_sweep = 0
        stale = [key for key, calls in self._calls.items() if not calls or calls[-1] <= horizon]
        for key in stale:
            del self._calls[key]
