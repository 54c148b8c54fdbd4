"""Viewer counts: each websocket server reports how many sockets it holds per queue (its own field of
the queue's `viewers` HASH); the stats sum the fresh ones."""

from __future__ import annotations

from typing import cast

from .connection import client
from .keys import queue_keys

VIEWERS_FRESH_SECONDS = 15


def viewers_report(counts: dict[str, int], *, instance: str, now: float) -> None:
    """A websocket server's count of open sockets per queue (its own field; read with viewers_count)."""
    pipe = client().pipeline(transaction=False)
    for slug, count in counts.items():
        pipe.hset(queue_keys(slug).viewers, instance, f"{count}:{int(now)}")
    pipe.execute()


def viewers_count(slug: str, *, now: float) -> int:
    """Sockets watching a queue, summed over websocket servers that reported in the last 15 s."""
    key = queue_keys(slug).viewers
    total, stale = 0, []
    for instance, value in cast(dict[str, str], client().hgetall(key)).items():
        count, _, at = value.partition(":")
        if now - float(at or 0) > VIEWERS_FRESH_SECONDS:
            stale.append(instance)
        else:
            total += int(count)
    if stale:
        client().hdel(key, *stale)  # servers that stopped reporting (stopped, or crashed)
    return total
