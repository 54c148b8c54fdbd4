"""Who is watching: each websocket holds a lease under its ticket (a few per ticket at most), renewed by
its server in its roll calls, which also keep the sockets' waiting visitors present; the stats count
tickets with a live socket (store/viewers.py, lua/roll_call.lua)."""

from __future__ import annotations

from collections.abc import Sequence

from ..store import viewers as viewer_store
from ..store.viewers import OVERDUE, PARKED, UNKNOWN, WAITING, Answering, RollCall, SocketLease, aroll_call

__all__ = [
    "OVERDUE",
    "PARKED",
    "UNKNOWN",
    "WAITING",
    "Answering",
    "RollCall",
    "SocketLease",
    "aroll_call",
    "aviewer_open",
    "aviewers_close",
]


async def aviewer_open(lease: SocketLease, *, most: int, now: float) -> bool:
    """A socket starts watching; False (and not counted) when its ticket already holds `most` sockets."""
    return await viewer_store.aviewer_open(lease, most=most, now=now)


async def aviewers_close(slug: str, leases: Sequence[SocketLease], *, now: float) -> None:
    """Sockets of one queue closed: their leases given back, in one call."""
    await viewer_store.aviewers_close(slug, leases, now=now)
