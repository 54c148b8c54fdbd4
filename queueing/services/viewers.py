"""Who is watching: each websocket holds a lease under its ticket (a few per ticket at most), renewed by
its server; the stats count tickets with a live socket (store/viewers.py)."""

from __future__ import annotations

from collections.abc import Iterable

from ..store import viewers as viewer_store
from ..store.viewers import SocketLease

__all__ = ["SocketLease", "viewer_close", "viewer_open", "viewers_report"]


def viewer_open(lease: SocketLease, *, most: int, now: float) -> bool:
    """A socket starts watching; False (and not counted) when its ticket already holds `most` sockets."""
    return viewer_store.viewer_open(lease, most=most, now=now)


def viewer_close(lease: SocketLease, *, now: float) -> None:
    viewer_store.viewer_close(lease, now=now)


def viewers_report(leases: Iterable[SocketLease], *, now: float) -> None:
    """A websocket server renews the leases of the sockets it holds."""
    viewer_store.viewers_report(leases, now=now)
