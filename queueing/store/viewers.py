"""Who is watching, across websocket servers: each open socket holds a lease in Redis under its ticket
(lua/viewer_open.lua), at most a few per ticket, and a ticket with a live socket is one watcher of its
queue. The stats count watchers, so a visitor's tabs are one viewer however many servers hold them.

Leases end on their own (VIEWERS_FRESH_SECONDS) unless the server holding the socket renews them, so a
server that crashed stops counting, and stops using up its visitors' sockets, within that time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .connection import ScriptCall, client, run, run_together
from .keys import queue_keys

VIEWERS_FRESH_SECONDS = 45  # a socket's lease; its server renews it well before (consumers.py)


class SocketLease(NamedTuple):
    slug: str
    ticket_id: str
    socket_id: str


def _keys(lease: SocketLease) -> list[str]:
    keys = queue_keys(lease.slug)
    return [keys.tagged(f"sockets:{lease.ticket_id}"), keys.tagged("watchers")]


def _ms(now: float) -> int:
    return int(now * 1000)


def viewer_open(lease: SocketLease, *, most: int, now: float) -> bool:
    """Take a socket's lease; False when its ticket already holds `most` live sockets."""
    args = [lease.socket_id, lease.ticket_id, _ms(now), VIEWERS_FRESH_SECONDS * 1000, most]
    taken, _held = run("viewer_open", _keys(lease), args)
    return bool(taken)


def viewer_close(lease: SocketLease, *, now: float) -> None:
    run("viewer_close", _keys(lease), [lease.socket_id, lease.ticket_id, _ms(now)])


def viewers_report(leases: Iterable[SocketLease], *, now: float) -> None:
    """A websocket server renews the leases of the sockets it holds (one round trip)."""
    calls: list[ScriptCall] = [
        ("viewer_open", _keys(lease), [lease.socket_id, lease.ticket_id, _ms(now), VIEWERS_FRESH_SECONDS * 1000, 0])
        for lease in leases
    ]
    if calls:
        run_together(calls)


def viewers_count(slug: str, *, now: float) -> int:
    """Tickets with a live socket on the queue, over all websocket servers."""
    return int(client().zcount(queue_keys(slug).tagged("watchers"), f"({_ms(now)}", "+inf"))
