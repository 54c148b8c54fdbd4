"""How long a server's event loop stopped: the figure behind every latency a websocket server gives.

A task asks to wake every TICK_SECONDS and notes how late it woke; anything that holds the loop (a full
garbage collection, a fan-out to thousands of sockets, a synchronous call by mistake) shows as lateness.
Every WR_WS_REPORT_SECONDS the worst pause of the period is logged with what the server holds, as a
warning when it reached STALL_MS (visitors then heard their news that much later). bench/push_bench.py
reads these lines.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

logger = logging.getLogger(__name__)

# A pause that begins just after a tick is seen only when the next tick wakes, a tick later: the figure is
# short by up to a tick. At 50 ms a crowd's close that held the loop 115 ms was reported as 70.
TICK_SECONDS = 0.01
STALL_MS = 250.0
MARK = "worst event-loop pause"  # what bench/push_bench.py looks for


@dataclass
class LoopWatch:
    describe: Callable[[], str] = lambda: ""  # what the server holds, for the report
    worst_ms: float = 0.0  # the worst pause of the period so far
    gc_worst_ms: float = 0.0  # the longest garbage collection of the period so far
    gc_worst_generation: int = 0
    reports: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _gc_started: float = field(default=0.0, repr=False)

    def ensure(self, describe: Callable[[], str]) -> None:
        """Watch the running loop (once per loop; a no-op while WR_WS_REPORT_SECONDS is 0)."""
        self.describe = describe
        if settings.WR_WS_REPORT_SECONDS <= 0:
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.ensure_future(self._run())
            if self._collection not in gc.callbacks:
                gc.callbacks.append(self._collection)

    def _collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = (time.perf_counter() - self._gc_started) * 1000
        if took > self.gc_worst_ms:
            self.gc_worst_ms, self.gc_worst_generation = took, info["generation"]

    def note(self, late_ms: float) -> None:
        self.worst_ms = max(self.worst_ms, late_ms)

    def report(self, seconds: float) -> None:
        worst, self.worst_ms = self.worst_ms, 0.0
        collection, generation, self.gc_worst_ms = self.gc_worst_ms, self.gc_worst_generation, 0.0
        self.reports += 1
        level = logging.WARNING if worst >= STALL_MS else logging.INFO
        pid, held = os.getpid(), self.describe()
        logger.log(
            level,
            "websocket server %s: %s, %s %.1f ms in %.0f s (longest garbage collection %.1f ms, generation %s)",
            *(pid, held, MARK, worst, seconds, collection, generation),
        )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK_SECONDS)
            woke = loop.time()
            self.note((woke - before - TICK_SECONDS) * 1000)
            if woke - started >= settings.WR_WS_REPORT_SECONDS:
                self.report(woke - started)
                started = woke


watch = LoopWatch()
