"""Tracked mode (SPEC 3): a visitor's own transitions, one wrapper per script, each with the parser of
the reply its script returns (the script's header lists it).

join.lua, status.lua, leave.lua, promote.lua, neighbours.lua, session_start.lua, complete.lua, revoke.lua.
Times cross this boundary as integer milliseconds since the epoch, always supplied by the caller.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Self, cast

from .connection import Plan, ScriptCall, execute, run
from .keys import QueueKeys, queue_keys
from .limits import LimitCall, LimitReply
from .replies import Reply, converters_of, maybe, optional, whole


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


# A status as a script returns it (an integer; its text from a pipeline that decodes replies), looked up:
# the enum's own lookup by value cost a poll about a microsecond.
_STATUSES: dict[object, TicketStatus] = {**{int(s): s for s in TicketStatus}, **{str(int(s)): s for s in TicketStatus}}


def _status(value: Any) -> TicketStatus:
    return _STATUSES.get(value) or TicketStatus(int(value))


@dataclass(frozen=True)
class PollFigures(Reply):
    """What a poll's answer needs of the queue as the script saw it: `poll_figures()` in lua/_lib.lua,
    returned by status (a poll reads no more than it answers with)."""

    state: str
    capacity: int
    used: int
    waiting: int
    evseq: int
    presence_timeout_s: int
    target_url: str
    epoch: int
    claim_ttl_s: int
    starts_at_ms: int  # 0: no scheduled start
    # ln(wait had / wait told) at the 10th and 90th percentiles of the queue's admissions (lua/_lib.lua
    # wait_learn): the estimate's range is the estimate times e^wait_low .. e^wait_high.
    wait_low: float
    wait_high: float
    # When the first slot held by a visitor taken to have left the site without finishing ends (ms; 0:
    # none): held far longer than the queue's holds (lua/_holds.lua returns_look), it comes back then.
    held_gone_until_ms: int

    CONVERT = {"held_gone_until_ms": whole}

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)

    def wait_range(self, estimate: int | None) -> list[int] | None:
        """[low, high] seconds around an estimate: about 8 in 10 of the queue's waits fell within it."""
        if estimate is None:
            return None
        low = math.floor(estimate * math.exp(min(0.0, self.wait_low)))
        high = math.ceil(estimate * math.exp(max(0.0, self.wait_high)))
        return [low, high]


@dataclass(frozen=True)
class QueueFigures(PollFigures):
    """A poll's figures and what estimates, stats and broadcasts need as well: `figures()` in
    lua/_transitions.lua, returned by join and admit."""

    outflow_per_minute: float
    ema_rate: float
    ema_ts_ms: int
    ema_service_ms: float
    admitted_total: int
    away: int  # waiting visitors parked because they were absent at the head
    name: str

    CONVERT = {**PollFigures.CONVERT, "ema_ts_ms": whole}


def _line_score(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class TicketState(Reply):
    """A ticket as `ticket_reply()` in lua/_lib.lua returns it (join and status; a join adds its score)."""

    ticket_id: str
    seq: int
    status: TicketStatus
    rank: int | None  # 0-based place in the line while waiting (-1 in the reply: not in line)
    fence: int
    expires_ms: int
    est_wait_s: int | None  # -1 in the reply: no estimate
    reason: str
    freed: bool  # this call released a slot: run admission
    priority: int
    score: float | None = None  # its line score (joins only; None when not in line)

    CONVERT = {"status": _status, "rank": optional, "est_wait_s": optional, "score": _line_score}

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> TicketState:
        # A poll's reply ends before the line score a join's carries.
        return super().parse([*raw, None] if len(raw) == len(converters_of(cls)) - 1 else raw)


def _ops(raw: Sequence[Any]) -> list[tuple[str, int, int]]:
    return [(str(op), int(rank), int(count)) for op, rank, count in raw]


@dataclass(frozen=True)
class Moves(Reply):
    """How a transition moved other visitors' places: ('-', rank, count) left, ('+', rank, count) placed.

    `seq` is the queue's event sequence after this transition (0 when nobody moved): clients apply
    moves in sequence order and poll when they see a gap. `moves_reply()` in lua/_lib.lua.
    """

    seq: int
    ops: list[tuple[str, int, int]]

    CONVERT = {"ops": _ops}

    @classmethod
    def parse(cls, raw: Any) -> Self:
        """`moves_reply()` answers 0 when nobody moved (most calls: no tables to build and send)."""
        if raw == 0:
            return cast(Self, NO_MOVES)
        return super().parse(raw)


NO_MOVES = Moves(0, [])


@dataclass(frozen=True)
class TicketReply(Reply):
    """A join or status reply: {outcome, ticket, figures, moves}. outcome: created | existing | ok | gone |
    closed | full | not_open | capped | pow_required | pow_reused | stateless | no_config | no_seq."""

    outcome: str
    ticket: TicketState | None
    figures: QueueFigures | None
    moves: Moves = NO_MOVES

    CONVERT = {"ticket": maybe(TicketState.parse), "figures": maybe(QueueFigures.parse), "moves": Moves.parse}


@dataclass(frozen=True)
class StatusReply(Reply):
    """A status reply: {outcome, ticket, figures, moves} as TicketReply's, with a poll's figures. outcome:
    ok | limited | gone | no_config."""

    outcome: str
    ticket: TicketState | None
    figures: PollFigures | None
    moves: Moves = NO_MOVES

    CONVERT = {"ticket": maybe(TicketState.parse), "figures": maybe(PollFigures.parse), "moves": Moves.parse}


def join_plan(
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
    limit: LimitCall | None = None,
) -> Plan[tuple[TicketReply | None, LimitReply | None]]:
    """A join. With `address`, the queue's per-address cap (if it has one) applies; with a solved
    proof-of-work challenge (`pow_bits` shown, `pow_id` its id), the queue's gate (if on) lets it in once.
    With `limit`, its rate limiter runs first in the same script, and a refused join goes no further (its
    reply is then None). The join limiter's key is per client address, outside the queue's hash tag: one
    Redis runs it in the same script; a cluster (issue 16) needs it in the queue's slot or apart."""
    keys = queue_keys(slug)
    all_keys = [*keys.script_keys(), keys.tagged(f"addr:{address}"), keys.tagged(f"pow:{pow_id}")]  # KEYS[12], [13]
    args = (visitor_key, now_ms, priority, display_name, int(bool(address)), pow_bits, pow_ttl_ms)
    call: ScriptCall = ("join", all_keys, args)
    if limit is None:
        return Plan((call,), lambda replies: (TicketReply.parse(replies[0]), None))

    def read(replies: list[Any]) -> tuple[TicketReply | None, LimitReply | None]:
        joined = TicketReply.parse(replies[1]) if len(replies) > 1 else None
        return joined, LimitReply.parse(replies[0])

    return Plan((limit.call, call), read, gated=True)


def join(slug: str, **arguments: Any) -> TicketReply:
    """join_plan without a limiter, run."""
    reply = execute(join_plan(slug, **arguments))[0]
    assert reply is not None
    return reply


class Restore(NamedTuple):
    """What a signed ticket says of its place, to restore it after lost state (status.lua)."""

    epoch: int
    priority: int
    placement: float | None
    joined_ms: int

    def args(self) -> tuple[int, int, str, int]:
        return (self.epoch, self.priority, "" if self.placement is None else repr(self.placement), self.joined_ms)


NO_RESTORE = Restore(0, 0, None, 0)


def status_plan(
    slug: str,
    *,
    visitor_key: str,
    seq: int,
    now_ms: int,
    limit: LimitCall | None = None,
    restore: Restore = NO_RESTORE,
) -> Plan[tuple[StatusReply, LimitReply | None]]:
    """A status poll, with its rate limiter in the same script when `limit` is given (a refused poll still
    counts as the visitor's heartbeat). A token bucket (the default) is status.lua's own, kept in the
    ticket's record; another algorithm runs first in the same call, its key sharing the queue's hash tag
    (ratelimit.prepare's `queue`)."""
    args = (visitor_key, seq, now_ms, *restore.args())
    if limit is not None and limit.algorithm == "token_bucket":
        limit_now, capacity, rate, cost = limit.args
        poll: ScriptCall = ("status", queue_keys(slug).script_keys(), (*args, capacity, rate, cost, limit_now))
        return Plan((poll,), _read_limited_status)
    poll = ("status", queue_keys(slug).script_keys(), args)
    if limit is None:
        return Plan((poll,), lambda replies: (StatusReply.parse(replies[0]), None))
    return Plan((limit.call, poll), lambda replies: (StatusReply.parse(replies[1]), LimitReply.parse(replies[0])))


def _read_limited_status(replies: Sequence[Any]) -> tuple[StatusReply, LimitReply | None]:
    reply = replies[0]
    return StatusReply.parse(reply[:4]), LimitReply.parse(reply[4]) if len(reply) > 4 else None


def status(slug: str, *, visitor_key: str, seq: int, now_ms: int, restore: Restore = NO_RESTORE) -> StatusReply:
    return execute(status_plan(slug, visitor_key=visitor_key, seq=seq, now_ms=now_ms, restore=restore))[0]


@dataclass(frozen=True)
class ChangeReply(Reply):
    """leave.lua, revoke.lua and complete.lua: {result, freed 0|1, moves}."""

    result: str
    freed: bool
    moves: Moves

    CONVERT = {"moves": Moves.parse}


def leave(slug: str, *, visitor_key: str, seq: int, now_ms: int) -> ChangeReply:
    return ChangeReply.parse(run("leave", queue_keys(slug).script_keys(), (visitor_key, seq, now_ms)))


@dataclass(frozen=True)
class PromoteReply(Reply):
    """promote.lua: {outcome, ticket, moves, rank before (or, when 'gone' finished it, 1 if that freed a
    slot)}. outcome: promoted | kept | not_waiting | gone | no_config."""

    outcome: str
    ticket: TicketState | None
    moves: Moves
    before: int

    CONVERT = {"ticket": maybe(TicketState.parse), "moves": Moves.parse}

    @property
    def freed(self) -> bool:
        return self.outcome == "gone" and self.before == 1


def promote(slug: str, *, visitor_key: str, seq: int, level: int, now_ms: int) -> PromoteReply:
    """A waiting visitor's priority code raises its level and moves it ahead (lua/promote.lua)."""
    return PromoteReply.parse(run("promote", queue_keys(slug).script_keys(), (visitor_key, seq, now_ms, level)))


def revoke(slug: str, *, ticket_id: str, now_ms: int) -> ChangeReply:
    return ChangeReply.parse(run("revoke", queue_keys(slug).script_keys(), (ticket_id, now_ms)))


@dataclass(frozen=True)
class Neighbour(Reply):
    """One row of neighbours.lua: {rank, display name, is me 0|1, priority}."""

    rank: int
    display_name: str
    is_me: bool
    priority: int


def neighbours(
    slug: str, *, visitor_key: str, seq: int, before: int, after: int, now_ms: int
) -> tuple[int | None, list[Neighbour]]:
    """The visitor's rank and the few visitors around it, in line order (None when not in line; none
    around before a scheduled start's draw): neighbours.lua replies {rank or -1, {{rank, display name,
    is me 0|1, priority}, ...}}."""
    rank, rows = run("neighbours", queue_keys(slug).script_keys(), (visitor_key, seq, before, after, now_ms))
    if int(rank) < 0:
        return None, []
    return int(rank), [Neighbour.parse(row) for row in rows]


@dataclass(frozen=True)
class SessionReply(Reply):
    """session_start.lua: {result, the session's end (ms), freed 0|1}."""

    result: str
    expires_ms: int
    freed: bool


def session_start(
    slug: str,
    *,
    visitor_key: str,
    seq: int,
    fence: int,
    now_ms: int,
    epoch: int = 0,
    expires_ms: int = 0,
    binding: str = "",
    rebind: bool = False,
) -> SessionReply:
    """With the access token's epoch and expiry, a session lost with the state starts again. `binding`: the
    digest of the presenting browser's secret (session_start.lua binds the session to the first one)."""
    keys = queue_keys(slug)
    args = (visitor_key, seq, fence, now_ms, epoch, expires_ms, binding, "1" if rebind else "0")
    return SessionReply.parse(run("session_start", [*keys.script_keys(), binding_key(keys, visitor_key, seq)], args))


def binding_key(keys: QueueKeys, visitor_key: str, seq: int) -> str:
    """Which browser a session is bound to (session_start.lua), one key per ticket: a later visit of the same
    visitor is not bound by an earlier one's (complete.lua deletes it with its session)."""
    return keys.tagged(f"bind:{visitor_key}:{seq}")


def complete(slug: str, *, visitor_key: str, seq: int, fence: int, now_ms: int, epoch: int) -> ChangeReply:
    args = (visitor_key, seq, fence, now_ms, epoch)
    keys = queue_keys(slug)
    return ChangeReply.parse(run("complete", [*keys.script_keys(), binding_key(keys, visitor_key, seq)], args))
