"""Worker processes for the CPU work of requests, in two lanes, so no request holds the service.

Why processes, not threads: parsing and planning are pure-Python CPU work, so threads would take
turns on one GIL with the event loop (a 10-second plan stalled health checks for seconds); a
process runs on its own core, its CPU time can be measured and bounded per request by the kernel
(:mod:`neurarch_trace.server.work`), it can run at a lower priority, and a crash or a memory
blow-up takes down only that worker (the lane starts new ones). The price is copying the body
to the worker and the answer back: about a millisecond for a ResNet-50 graph.

Lanes: a *fast* lane of ``settings.workers`` processes takes bodies up to ``fast_lane_bytes``
with a short CPU slice (``fast_lane_budget_s``); a plan that needs more moves to the *large* lane
(``heavy_workers`` processes at ``nice`` +10) with the full ``plan_budget_s``, as does any larger
body from the start. So large plans queue behind each other, never in front of small ones, and the
kernel prefers the small ones' processes when cores are short. Each worker's address space is
capped (``worker_memory_mb``), so one request cannot exhaust the host's memory. Each lane admits at most
``queue_max`` waiting jobs; beyond that :class:`Busy` (a 503 with ``Retry-After``).

Workers come from a ``forkserver`` that has imported the planner once, so a new worker starts in
milliseconds and inherits no threads or sockets of the server.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import resource
import select
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Optional

import neurarch_trace.server.work as work
from neurarch_trace.server.settings import Settings
from neurarch_trace.server.work import JobResult

__all__ = ["Busy", "PlanPool"]

log = logging.getLogger("neurarch_trace.server")

#: Priority of the large-plan workers (``nice`` increment): the kernel runs small plans first.
HEAVY_NICE = 10
_PRELOAD = ["neurarch_trace.server.work"]


class Busy(Exception):
    """A lane's queue is full; ``retry_after`` seconds is a fair wait."""

    def __init__(self, sentence: str, retry_after: int) -> None:
        super().__init__(sentence)
        self.retry_after = retry_after


def _exit_with(server_pid: int) -> None:
    """Wait until the server process is gone, then end this worker. A worker's parent is the
    forkserver, and the workers and the forkserver keep each other's pipes open, so after a
    ``kill -9`` of the server nothing else would ever end them."""
    try:
        fd = os.pidfd_open(server_pid)
    except (AttributeError, OSError):  # not Linux 5.3+: look once a second
        while True:
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                pass
            time.sleep(1.0)
    else:
        select.select([fd], [], [])  # readable when the process has exited
    os._exit(0)


def _init_worker(nice: int, server_pid: int, memory_bytes: int) -> None:
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    if memory_bytes:  # a request that needs more gets a MemoryError (413), not the host's OOM killer
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    threading.Thread(target=_exit_with, args=(server_pid,), name="server-watch", daemon=True).start()


class _Lane:
    def __init__(self, name: str, workers: int, nice: int, queue_max: int, memory_bytes: int) -> None:
        self.name = name
        self.memory_bytes = memory_bytes
        self.workers = workers
        self.nice = nice
        self.queue_max = queue_max
        self.pending = 0
        self._lock = threading.Lock()
        self._executor: Optional[ProcessPoolExecutor] = None

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(_PRELOAD)
                self._executor = ProcessPoolExecutor(
                    self.workers, mp_context=context, initializer=_init_worker,
                    initargs=(self.nice, os.getpid(), self.memory_bytes))
            return self._executor

    def _reset(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = None
        broken.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[..., JobResult], *args: Any) -> JobResult:
        if self.pending >= self.queue_max + self.workers:
            raise Busy(f"the plan service is busy ({self.name} lane full); retry shortly", 5)
        self.pending += 1
        try:
            for attempt in range(2):
                executor = self._pool()
                try:
                    future: Future = executor.submit(fn, *args)
                except (BrokenProcessPool, RuntimeError):
                    self._reset(executor)
                    continue
                try:
                    return await asyncio.wrap_future(future)
                except asyncio.CancelledError:
                    future.cancel()  # the client went away: drop the job if it has not started
                    raise
                except BrokenProcessPool:
                    log.error("a %s-lane worker died; starting new ones", self.name)
                    self._reset(executor)
                    if attempt:
                        break
            return JobResult(503, sentence="a plan worker failed on this request; retry shortly")
        finally:
            self.pending -= 1

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            processes = list(getattr(executor, "_processes", {}).values())
            executor.shutdown(wait=False, cancel_futures=True)
            for process in processes:  # a running 10-second plan must not hold up shutdown
                process.terminate()


class PlanPool:
    """The two lanes for ``settings``; ``await pool.plan(raw)`` and ``await pool.page(doc)``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        memory = settings.worker_memory_mb * 2**20
        self.fast = _Lane("small-plan", settings.workers, 0, settings.queue_max, memory)
        self.heavy = _Lane("large-plan", settings.heavy_workers, HEAVY_NICE, max(4, settings.queue_max // 4), memory)

    async def plan(self, raw: bytes) -> JobResult:
        """The worker's answer for the request body ``raw``. Raises :class:`Busy`."""
        s = self.settings
        if len(raw) <= s.fast_lane_bytes and s.fast_lane_budget_s < s.plan_budget_s:
            result = await self.fast.run(work.plan_job, raw, s.max_depth, s.fast_lane_budget_s)
            if not result.over_budget:
                return result
        elif len(raw) <= s.fast_lane_bytes:
            return await self.fast.run(work.plan_job, raw, s.max_depth, s.plan_budget_s)
        return await self.heavy.run(work.plan_job, raw, s.max_depth, s.plan_budget_s)

    async def page(self, doc_gz: bytes, nonce: str) -> JobResult:
        """The share page for a stored document, its script tag carrying ``nonce``. Raises :class:`Busy`."""
        lane = self.fast if len(doc_gz) * 10 <= self.settings.fast_lane_bytes else self.heavy
        return await lane.run(work.page_job, doc_gz, nonce, self.settings.plan_budget_s)

    def close(self) -> None:
        self.fast.close()
        self.heavy.close()
