"""Who is watching, across websocket servers: each open socket holds a lease in Redis under its ticket
(lua/viewer_open.lua), at most a few per ticket, and a ticket with a live socket is one watcher of its
queue. The stats count watchers, so a visitor's tabs are one viewer however many servers hold them.

Leases end on their own (VIEWERS_FRESH_SECONDS) unless the server holding the socket renews them, so a
server that crashed stops counting, and stops using up its visitors' sockets, within that time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .connection import arun, client
from .keys import queue_keys
from .replies import Reply

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


async def aviewer_open(lease: SocketLease, *, most: int, now: float) -> bool:
    """Take a socket's lease; False when its ticket already holds `most` live sockets."""
    args = [lease.socket_id, lease.ticket_id, _ms(now), VIEWERS_FRESH_SECONDS * 1000, most]
    taken, _held = await arun("viewer_open", _keys(lease), args)
    return bool(taken)


async def aviewers_close(slug: str, leases: Sequence[SocketLease], *, now: float) -> None:
    """Give back the leases of sockets of one queue that closed (lua/viewer_close.lua), in one call."""
    args: list[Any] = [_ms(now)]
    for lease in leases:
        args += (lease.socket_id, lease.ticket_id)
    await arun("viewer_close", [queue_keys(slug).tagged("watchers")], args)


class Answering(NamedTuple):
    """A socket in a roll call: its lease, and the ticket it answers for ('' and 0 for a stateless queue's
    ticket, which has no presence to keep: its lease is renewed, nothing more)."""

    lease: SocketLease
    visitor_key: str
    seq: int


def _news(raw: Sequence[Any]) -> list[tuple[int, int]]:
    return [(int(raw[i]) - 1, int(raw[i + 1])) for i in range(0, len(raw), 2)]


@dataclass(frozen=True)
class RollCall(Reply):
    """roll_call.lua's reply: news = [(index in the call, code)] for the sockets whose ticket is not simply
    waiting in line (the codes are the script's: a ticket status, 0 unknown, PARKED, OVERDUE)."""

    outcome: str
    presence_timeout_s: float
    claim_ttl_s: float
    news: list[tuple[int, int]]

    CONVERT = {"news": _news}


WAITING, PARKED, OVERDUE, UNKNOWN = 1, -1, -2, 0  # TicketStatus.WAITING, then the script's own


async def aroll_call(slug: str, sockets: Sequence[Answering], *, now: float) -> RollCall:
    """Renew these sockets' leases and see their waiting visitors present, in one call (lua/roll_call.lua)."""
    args: list[Any] = [_ms(now), VIEWERS_FRESH_SECONDS * 1000]
    for lease, visitor_key, seq in sockets:
        args += (lease.socket_id, lease.ticket_id, visitor_key, seq)
    return RollCall.parse(await arun("roll_call", queue_keys(slug).script_keys(), args))


def viewers_count(slug: str, *, now: float) -> int:
    """Tickets with a live socket on the queue, over all websocket servers."""
    return int(client().zcount(queue_keys(slug).tagged("watchers"), f"({_ms(now)}", "+inf"))
