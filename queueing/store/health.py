"""The protected site's health counts (see queueing/health.py for what they mean): per queue, one HASH per
second of reports (n requests, e errors, b<i> histogram bucket counts), kept KEEP_SECONDS."""

from __future__ import annotations

from typing import NamedTuple

from .connection import client
from .keys import queue_keys

# Reports are kept a little longer than the longest window they can be read for (a queue's adjustment
# interval: at most 120 s, models.ADAPTIVE_INTERVAL_MAX_SECONDS; health.py checks), then expire.
KEEP_SECONDS = 130


def health_slice_key(slug: str, second: int) -> str:
    """The protected site's responses reported in one second."""
    return f"{queue_keys(slug).health}:{second}"


def health_slice_keys(slug: str, *, newest: int) -> list[str]:
    """Every slice key that may still exist (to drop them with the queue)."""
    return [health_slice_key(slug, second) for second in range(newest - KEEP_SECONDS, newest + 2)]


def health_report(slug: str, *, now_ms: int, requests: int, errors: int, buckets: dict[int, int]) -> None:
    """Add one report to the current second's counts.

    Pure increments with no decision to take, so a MULTI/EXEC pipeline is as atomic as a script would be
    (the counts and the expiry land together or not at all, in one round trip): no Lua file needed.
    """
    key = health_slice_key(slug, now_ms // 1000)
    pipe = client().pipeline(transaction=True)
    pipe.hincrby(key, "n", requests)
    if errors:
        pipe.hincrby(key, "e", errors)
    for index, count in buckets.items():
        pipe.hincrby(key, f"b{index}", count)
    pipe.expire(key, KEEP_SECONDS)
    pipe.execute()


class HealthCounts(NamedTuple):
    """The reports of a window of seconds, summed: requests, errors, histogram bucket counts."""

    window_seconds: int
    requests: int
    errors: int
    buckets: dict[int, int]


def health_window(slug: str, *, now_ms: int, seconds: int) -> HealthCounts:
    """The site's responses reported in the last `seconds` seconds (the current one included), summed."""
    newest = now_ms // 1000
    pipe = client().pipeline(transaction=False)
    for second in range(newest - seconds + 1, newest + 1):
        pipe.hgetall(health_slice_key(slug, second))
    requests = errors = 0
    buckets: dict[int, int] = {}
    for counts in pipe.execute():
        for field_name, value in counts.items():
            if field_name == "n":
                requests += int(value)
            elif field_name == "e":
                errors += int(value)
            elif field_name.startswith("b"):
                index = int(field_name[1:])
                buckets[index] = buckets.get(index, 0) + int(value)
    return HealthCounts(seconds, requests, errors, buckets)
