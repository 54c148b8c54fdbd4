"""Tracked mode (SPEC 3): a visitor's own transitions, one wrapper per script, each with the parser of
the reply its script returns (the script's header lists it).

join.lua, status.lua, leave.lua, neighbours.lua, session_start.lua, complete.lua, revoke.lua.
Times cross this boundary as integer milliseconds since the epoch, always supplied by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .connection import run, run_together
from .keys import queue_keys
from .limits import LimitCall, LimitReply


class TicketStatus(enum.IntEnum):
    WAITING = 1
    ADMITTED = 2
    ACTIVE = 3
    COMPLETED = 4
    EXPIRED = 5
    REVOKED = 6

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def holds_slot(self) -> bool:
        return self in (TicketStatus.ADMITTED, TicketStatus.ACTIVE)


def _whole(value: Any) -> int:
    """An integer Redis may have stored as a float ('1.7e12')."""
    return int(float(value))


def _parse_fields(layout: Sequence[tuple[str, Callable[[Any], Any]]], raw: Sequence[Any]) -> dict[str, Any]:
    """A script's reply array as named, converted fields, in the order its header gives."""
    return {name: convert(value) for (name, convert), value in zip(layout, raw, strict=True)}


@dataclass(frozen=True)
class QueueFigures:
    """What a script saw of the queue when it ran (for estimates, stats and broadcasts): `figures()` in
    lua/_lib.lua, returned by join, status, admit."""

    state: str
    capacity: int
    used: int
    outflow_per_minute: float
    ema_rate: float
    ema_ts_ms: int
    ema_service_ms: float
    admitted_total: int
    waiting: int
    evseq: int
    presence_timeout_s: int
    target_url: str
    epoch: int
    away: int  # waiting visitors parked because they were absent at the head
    claim_ttl_s: int
    starts_at_ms: int  # 0: no scheduled start
    name: str

    LAYOUT = (
        ("state", str),
        ("capacity", int),
        ("used", int),
        ("outflow_per_minute", float),
        ("ema_rate", float),
        ("ema_ts_ms", _whole),
        ("ema_service_ms", float),
        ("admitted_total", int),
        ("waiting", int),
        ("evseq", int),
        ("presence_timeout_s", int),
        ("target_url", str),
        ("epoch", int),
        ("away", int),
        ("claim_ttl_s", int),
        ("starts_at_ms", int),
        ("name", str),
    )

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> QueueFigures | None:
        return cls(**_parse_fields(cls.LAYOUT, raw)) if raw else None


def _rank(value: Any) -> int | None:
    rank = int(value)
    return rank if rank >= 0 else None


@dataclass(frozen=True)
class TicketState:
    """A ticket as `ticket_reply()` in lua/_lib.lua returns it (join and status; a join adds its score)."""

    ticket_id: str
    seq: int
    status: TicketStatus
    rank: int | None  # 0-based place in the line while waiting
    fence: int
    expires_ms: int
    est_wait_s: int | None
    reason: str
    freed: bool  # this call released a slot: run admission
    priority: int
    score: float | None = None  # its line score (joins only; None when not in line)

    LAYOUT = (
        ("ticket_id", str),
        ("seq", int),
        ("status", lambda v: TicketStatus(int(v))),
        ("rank", _rank),
        ("fence", int),
        ("expires_ms", int),
        ("est_wait_s", _rank),
        ("reason", lambda v: str(v or "")),
        ("freed", lambda v: bool(int(v))),
        ("priority", int),
        ("score", float),
    )

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> TicketState:
        # A join's reply adds the line score; any other length is not a ticket.
        if len(raw) not in (len(cls.LAYOUT) - 1, len(cls.LAYOUT)):
            raise ValueError(f"a ticket reply has {len(cls.LAYOUT) - 1} or {len(cls.LAYOUT)} fields, not {len(raw)}")
        return cls(**_parse_fields(cls.LAYOUT[: len(raw)], raw))


@dataclass(frozen=True)
class Moves:
    """How a transition moved other visitors' places: ('-', rank, count) left, ('+', rank, count) placed.

    `seq` is the queue's event sequence after this transition (0 when nobody moved): clients apply
    moves in sequence order and poll when they see a gap. `moves_reply()` in lua/_lib.lua.
    """

    seq: int
    ops: list[tuple[str, int, int]]

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> Moves:
        seq, ops = raw
        return cls(seq=int(seq), ops=[(str(op), int(rank), int(count)) for op, rank, count in ops])


NO_MOVES = Moves(0, [])


@dataclass(frozen=True)
class TicketReply:
    """A join or status reply: {outcome, ticket, figures, moves}. outcome: created | existing | ok | gone |
    closed | full | not_open | capped | pow_required | pow_reused | stateless | no_config | no_seq."""

    outcome: str
    ticket: TicketState | None
    figures: QueueFigures | None
    moves: Moves = NO_MOVES

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> TicketReply:
        outcome, ticket, figures, moves = raw
        return cls(
            outcome=str(outcome),
            ticket=TicketState.parse(ticket) if ticket else None,
            figures=QueueFigures.parse(figures),
            moves=Moves.parse(moves),
        )


def join(
    slug: str,
    *,
    visitor_key: str,
    now_ms: int,
    priority: int,
    display_name: str,
    address: str = "",
    pow_bits: int = 0,
    pow_id: str = "",
    pow_ttl_ms: int = 0,
) -> TicketReply:
    """A join. With `address`, the queue's per-address cap (if it has one) applies; with a solved
    proof-of-work challenge (`pow_bits` shown, `pow_id` its id), the queue's gate (if on) lets it in once."""
    keys = queue_keys(slug)
    all_keys = [*keys.script_keys(), keys.tagged(f"addr:{address}"), keys.tagged(f"pow:{pow_id}")]  # KEYS[12], [13]
    args = (visitor_key, now_ms, priority, display_name, int(bool(address)), pow_bits, pow_ttl_ms)
    return TicketReply.parse(run("join", all_keys, args))


class Restore(NamedTuple):
    """What a signed ticket says of its place, to restore it after lost state (status.lua)."""

    epoch: int
    priority: int
    placement: float | None
    joined_ms: int

    def args(self) -> tuple[int, int, str, int]:
        return (self.epoch, self.priority, "" if self.placement is None else repr(self.placement), self.joined_ms)


NO_RESTORE = Restore(0, 0, None, 0)


def status(slug: str, *, visitor_key: str, seq: int, now_ms: int, restore: Restore = NO_RESTORE) -> TicketReply:
    args = (visitor_key, seq, now_ms, *restore.args())
    return TicketReply.parse(run("status", queue_keys(slug).script_keys(), args))


def status_limited(
    slug: str, *, visitor_key: str, seq: int, now_ms: int, limit: LimitCall, restore: Restore = NO_RESTORE
) -> tuple[TicketReply, LimitReply]:
    """A status poll and its rate limiter in one round trip (the limiter runs first; a refused poll
    still counts as the visitor's heartbeat)."""
    limited, reply = run_together(
        [
            (limit.script, [limit.key], limit.args),
            ("status", queue_keys(slug).script_keys(), (visitor_key, seq, now_ms, *restore.args())),
        ]
    )
    return TicketReply.parse(reply), LimitReply.parse(limited)


class ChangeReply(NamedTuple):
    """leave.lua and revoke.lua: {result, freed 0|1, moves}."""

    result: str
    freed: bool
    moves: Moves

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> ChangeReply:
        result, freed, moves = raw
        return cls(str(result), bool(int(freed)), Moves.parse(moves))


def leave(slug: str, *, visitor_key: str, seq: int, now_ms: int) -> ChangeReply:
    return ChangeReply.parse(run("leave", queue_keys(slug).script_keys(), (visitor_key, seq, now_ms)))


def revoke(slug: str, *, ticket_id: str, now_ms: int) -> ChangeReply:
    return ChangeReply.parse(run("revoke", queue_keys(slug).script_keys(), (ticket_id, now_ms)))


@dataclass(frozen=True)
class Neighbour:
    rank: int
    display_name: str
    is_me: bool
    priority: int

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> Neighbour:
        rank, name, me, priority = raw
        return cls(int(rank), str(name), bool(int(me)), int(priority))


def neighbours(slug: str, *, visitor_key: str, seq: int, before: int, after: int) -> tuple[int | None, list[Neighbour]]:
    """The visitor's rank and the few visitors around it, in line order (None when not in line):
    neighbours.lua replies {rank or -1, {{rank, display name, is me 0|1, priority}, ...}}."""
    rank, rows = run("neighbours", queue_keys(slug).script_keys(), (visitor_key, seq, before, after))
    if int(rank) < 0:
        return None, []
    return int(rank), [Neighbour.parse(row) for row in rows]


class SessionReply(NamedTuple):
    """session_start.lua: {result, the session's end (ms), freed 0|1}."""

    result: str
    expires_ms: int
    freed: bool

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> SessionReply:
        result, expires, freed = raw
        return cls(str(result), int(expires), bool(int(freed)))


def session_start(
    slug: str, *, visitor_key: str, seq: int, fence: int, now_ms: int, epoch: int = 0, expires_ms: int = 0
) -> SessionReply:
    """With the access token's epoch and expiry, a session lost with the state starts again."""
    args = (visitor_key, seq, fence, now_ms, epoch, expires_ms)
    return SessionReply.parse(run("session_start", queue_keys(slug).script_keys(), args))


class CompleteReply(NamedTuple):
    """complete.lua: {result, freed 0|1}."""

    result: str
    freed: bool

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> CompleteReply:
        result, freed = raw
        return cls(str(result), bool(int(freed)))


def complete(slug: str, *, visitor_key: str, seq: int, fence: int, now_ms: int) -> CompleteReply:
    args = (visitor_key, seq, fence, now_ms)
    return CompleteReply.parse(run("complete", queue_keys(slug).script_keys(), args))
