"""The clock as the engine reads it: services and limiters take `now` (seconds since the epoch) so tests can
drive it; Redis scripts get integer milliseconds."""

from __future__ import annotations

import time


def now_ms(now: float | None = None) -> int:
    """`now` (seconds since the epoch; None: the current time) in integer milliseconds."""
    return int((time.time() if now is None else now) * 1000)
