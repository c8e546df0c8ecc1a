"""Rate limiting shared by every replica on one database: GCRA, one row per active client.

The generic cell rate algorithm (ITU-T I.371's virtual scheduling, as redis-cell and the
``throttled`` libraries use it) keeps one number per client, its theoretical arrival time (TAT).
With ``limit`` calls per ``window`` seconds, each call moves the TAT ``window / limit`` seconds
later; a call is refused when that would put the TAT more than ``window`` ahead of now. So a new
client may burst ``limit`` calls, then gets one more every ``window / limit`` seconds: ``limit``
per window sustained. A refusal says how many whole seconds until the next call would pass
(``Retry-After``).

The check and the update are one SQL statement (an upsert whose ``WHERE`` is the GCRA test), so
two replicas counting the same client never both pass its last call. A row whose TAT has passed
says nothing a missing row would not: sweeps delete those, and, above ``max_buckets`` rows, the
rows closest to passing, so the table (and no process memory at all) holds the buckets.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Optional

from neurarch_trace.server.db import Database

__all__ = ["SWEEP_EVERY", "RateLimiter"]

#: Calls (per process) between sweeps of passed and surplus buckets.
SWEEP_EVERY = 100


class RateLimiter:
    """``hit(bucket)`` records a call and returns ``None``, or refuses it and returns the seconds to
    wait. A ``limit`` of 0 means no limit. Raises ``DatabaseError`` when the database fails."""

    def __init__(self, db: Database, limit: int, window_s: float, max_buckets: int = 100_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.limit = limit
        self.window_s = window_s
        self.max_buckets = max_buckets
        self._clock = clock
        self._lock = threading.Lock()
        self._since_sweep = 0
        g = db.greatest
        self._upsert = (
            "INSERT INTO rate_buckets (bucket, tat) VALUES (:b, :now + :t) "
            f"ON CONFLICT (bucket) DO UPDATE SET tat = {g}(rate_buckets.tat, :now) + :t "
            f"WHERE {g}(rate_buckets.tat, :now) + :t - :now <= :w RETURNING tat"
        )

    def hit(self, bucket: str) -> Optional[int]:
        if self.limit <= 0:
            return None
        now = self._clock()
        interval = self.window_s / self.limit
        with self.db.transaction(write=True) as cur:
            passed = cur.execute(self._upsert, {"b": bucket, "now": now, "t": interval, "w": self.window_s}).one()
            if passed is None:
                tat = float(cur.execute("SELECT tat FROM rate_buckets WHERE bucket = :b", {"b": bucket}).one()[0])
        with self._lock:
            self._since_sweep += 1
            sweep = self._since_sweep >= SWEEP_EVERY
            if sweep:
                self._since_sweep = 0
        if sweep:
            self.sweep(now)
        if passed is not None:
            return None
        return max(1, math.ceil(tat + interval - self.window_s - now))

    def sweep(self, now: Optional[float] = None) -> None:
        """Forget buckets whose TAT has passed, then the surplus over ``max_buckets``."""
        now = self._clock() if now is None else now
        with self.db.transaction(write=True) as cur:
            cur.execute("DELETE FROM rate_buckets WHERE tat <= :now", {"now": now})
            count = int(cur.execute("SELECT COUNT(*) FROM rate_buckets").one()[0])
            if count > self.max_buckets:
                cur.execute("DELETE FROM rate_buckets WHERE bucket IN (SELECT bucket FROM rate_buckets "
                            f"ORDER BY tat LIMIT {count - self.max_buckets})")
