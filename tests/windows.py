"""A fixed window is cut on the clock (every `window` seconds since the epoch). A test that counts requests up to
such a limit in real time must not straddle an edge: a new window lets the next request through. A CI run that
crossed 11:00 UTC once saw exactly that. A sliding window counter has the same edge when its limit is small: just
past it, the previous window's count is weighted a hair under 1 and rounded down, so one more request passes."""

from __future__ import annotations

import time
from typing import Any


def clear_of_a_window_edge(window_seconds: float, margin: float = 20.0) -> None:
    """Sleep past the current window's edge when it is less than `margin` seconds away."""
    left = window_seconds - time.time() % window_seconds
    if left < margin:
        time.sleep(left + 0.1)


def clear_of_a_configured_edge(config: dict[str, Any], margin: float = 20.0) -> None:
    """The same for a WR_RATE_LIMITS entry with windows cut on the clock (the buckets and the log have no edge)."""
    fixed = config["algorithm"] == "fixed_window"
    window = config.get("window_seconds" if fixed else "fixed_window_seconds")
    if window:
        clear_of_a_window_edge(window, margin)
