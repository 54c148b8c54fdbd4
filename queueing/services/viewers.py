"""Who is watching: each websocket server reports its open sockets per queue every few seconds."""

from __future__ import annotations

from .. import store


def viewers_report(counts: dict[str, int], *, instance: str, now: float) -> None:
    """A websocket server's count of open sockets per queue (the stats sum the servers' fresh reports)."""
    store.viewers_report(counts, instance=instance, now=now)
