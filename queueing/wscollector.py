"""The websocket server's garbage collector: long-lived objects frozen out of the collector's sight, and a full
collection when it costs no one anything (Collector). One per process, `collector`, started by the first
socket's hello (consumers.py)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time
from collections.abc import Callable

from django.conf import settings

from .wsprotocol import let_go_within
from .wsserver import roll_call

logger = logging.getLogger(__name__)

TRIM_AFTER_LEAVING = 1000  # sockets closed since the most held: the memory they used is given back to the OS


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


class Collector:
    """Keeps Python's garbage collection from stopping a server that holds thousands of sockets.

    Each socket is about a hundred long-lived objects (consumer, protocol, coroutines, scope): a full
    collection walks them all and stops the event loop, for 0.4 s at 5,000 sockets (bench/RESULTS.md),
    each time the automatic collector decides the oldest generation has grown enough. So every
    WR_WS_GC_FREEZE_SECONDS the objects alive are moved out of the collector's sight (gc.freeze): automatic
    collections walk only what is newer, a few seconds' worth.

    What the freeze hides is never collected for cycles: a frozen object that becomes garbage is freed by
    reference counting, or kept. A closed socket leaves no cycles (tests/test_slow_readers.py checks it
    through a real server), so the frozen objects hold no socket's garbage; a full collection over
    everything (gc.unfreeze, gc.collect) runs whenever the server holds no sockets, when it costs no one
    anything, and every WR_WS_GC_FULL_SECONDS if an operator sets it (0: never on a timer). Each one is
    logged with what it found, so a leak would show.

    When a crowd has left (TRIM_AFTER_LEAVING sockets fewer than the most held since the last time) and the
    keepalive sweep has let go of its sockets, the memory the C allocator holds free is given back to the OS
    (glibc's malloc_trim: a few milliseconds).
    A server that held 10,000 sockets kept its peak, 320 MB, after 9,000 of them closed (bench/RESULTS.md);
    what stays is Python's own: its small objects' arenas are given back only when wholly empty, and the
    sockets that stay hold objects in many of them.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self.full_collections = 0
        self.trims = 0
        self.most_held = 0  # sockets, since a crowd last left
        self.left = 0  # sockets closed by the crowds whose memory is to be given back
        self.trim_at: float | None = None  # when (time.monotonic) it is let go of

    def ensure(self) -> None:
        if settings.WR_WS_GC_FREEZE_SECONDS <= 0:
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.ensure_future(self._run())

    def cycle(self, *, full: bool) -> None:
        if full:
            started = time.perf_counter()
            gc.unfreeze()
            found = gc.collect()
            self.full_collections += 1
            logger.info(
                "websocket server: full garbage collection took %.1f ms, found %s unreachable objects",
                (time.perf_counter() - started) * 1000,
                found,
            )
        gc.freeze()

    def trim_after_crowd(self, held: int, now: float) -> bool:
        """Give the OS back the memory freed by the sockets closed since the most held, when that is
        TRIM_AFTER_LEAVING or more (`held`: the sockets held now), once the keepalive sweep has let go of
        them (wsprotocol.let_go_within): trimmed at once, it found their memory still in use. Whether it did."""
        self.most_held = max(self.most_held, held)
        if self.most_held - held >= TRIM_AFTER_LEAVING:
            self.left, self.trim_at = self.left + self.most_held - held, now + let_go_within()
            self.most_held = held
        trim = _malloc_trim()
        if self.trim_at is None or now < self.trim_at or trim is None:
            return False
        started = time.perf_counter()
        trim(0)
        self.trims += 1
        logger.info(
            "websocket server: %s sockets closed and let go of; memory given back in %.1f ms",
            *(self.left, (time.perf_counter() - started) * 1000),
        )
        self.left, self.trim_at = 0, None
        return True

    async def _run(self) -> None:
        last_full, idle_collected = time.monotonic(), False
        while True:
            await asyncio.sleep(settings.WR_WS_GC_FREEZE_SECONDS)
            idle = not roll_call().members
            timed = 0 < settings.WR_WS_GC_FULL_SECONDS <= time.monotonic() - last_full
            full = timed or (idle and not idle_collected)
            self.cycle(full=full)
            self.trim_after_crowd(roll_call().held(), time.monotonic())
            idle_collected = idle and (full or idle_collected)
            if full:
                last_full = time.monotonic()


collector = Collector()
