"""Stateless mode (SPEC 4): numbered tickets and a sliding window.

One HASH per queue (`win`) holds the counters (next number, last active place, when the window last
moved, ...) and the policy fields this mode needs, mirrored by config sync, so that a status is one
HMGET. Nothing is stored per visitor. lua/window/join.lua, tick.lua, epoch.lua.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .connection import Plan, ScriptCall, client, run
from .keys import queue_keys
from .limits import LimitCall, LimitReply
from .replies import Reply
from .state import LiveState

WINDOW_FIELDS = (
    "live",
    "epoch",
    "state",
    "next",
    "active",
    "at",
    "size",
    "interval_ms",
    "windows",
    "starts_ms",
    "ends_ms",
    "prequeue_ms",
    "target_url",
    "session_ttl",
    "shuffle_pending",
    "pq_first",
    "pq_last",
    "seed",
    "gap",
    "ema_rate",
    "ema_ts",
    "evseq",
    "name",
    "admitted",
    "qid",
)


@dataclass(frozen=True)
class Window:
    """A stateless queue's window as one read saw it. Places: a ticket's number less its epoch's gap (the
    numbers an epoch skipped after lost state); a pre-queue ticket's place then comes from the shuffle."""

    live: bool  # the epoch runs (False: the policy or the state is missing: sync)
    epoch: int
    state: str
    issued: int  # the last number issued, as a place
    next_number: int  # the last number issued
    active: int  # the last active place
    at_ms: int  # when the window last moved
    size: int
    interval_ms: int
    windows: int
    starts_ms: int
    ends_ms: int
    prequeue_ms: int
    target_url: str
    session_ttl: int
    shuffle_pending: bool
    prequeue: tuple[int, int] | None  # the pre-queue's numbers (first, last) once the shuffle is revealed
    seed: str
    ema_rate: float
    ema_ts_ms: int
    evseq: int
    name: str
    admitted: int
    queue_id: int = 0  # the queue's row (its tickets carry it: a queue made again under a slug is another)
    ticket_gap: int = 0  # the gap of the epoch the asking ticket was issued in
    # The asking ticket's epoch is not one of this window's: it began in a sale before a change of mode (every
    # epoch of the window records its gap, `gap:<epoch>`, the first one's too; a switch forgets them).
    ticket_void: bool = False

    @classmethod
    def parse(cls, raw: Sequence[Any], ticket_gap: Any = "current", ticket_epoch: int = 0) -> Window:
        """`ticket_gap`: the gap of the asking ticket's epoch (`ticket_epoch`) as read (None: not recorded),
        or "current" for a ticket of the current epoch (a join)."""
        v = dict(zip(WINDOW_FIELDS, raw, strict=True))
        if ticket_gap == "current":
            ticket_gap = v["gap"]
        void = ticket_epoch > 0 and ticket_gap is None and str(ticket_epoch) != str(v["epoch"])

        def num(name: str) -> int:
            return int(float(v[name] or 0))

        first, last = num("pq_first"), num("pq_last")
        return cls(
            live=bool(v["live"]) and v["live"] == v["epoch"],
            epoch=num("epoch"),
            state=str(v["state"] or ""),
            issued=num("next") - num("gap"),
            next_number=num("next"),
            active=num("active"),
            at_ms=num("at"),
            size=max(1, num("size")),
            interval_ms=max(1, num("interval_ms")),
            windows=max(1, num("windows")),
            starts_ms=num("starts_ms"),
            ends_ms=num("ends_ms"),
            prequeue_ms=num("prequeue_ms"),
            target_url=str(v["target_url"] or ""),
            session_ttl=num("session_ttl"),
            shuffle_pending=v["shuffle_pending"] == "1",
            prequeue=(first, last) if v["seed"] and first and last >= first else None,
            seed=str(v["seed"] or ""),
            ema_rate=float(v["ema_rate"] or 0),
            ema_ts_ms=num("ema_ts"),
            evseq=num("evseq"),
            name=str(v["name"] or ""),
            admitted=num("admitted"),
            queue_id=num("qid"),
            ticket_gap=int(float(ticket_gap or 0)),
            ticket_void=void,
        )


def window_read_plan(
    slug: str, *, ticket_epoch: int = 0, limit: LimitCall | None = None
) -> Plan[tuple[Window, LimitReply | None]]:
    """The window (with the gap of the asking ticket's epoch), and the ticket's rate limiter in the same
    script when `limit` is given (its key under the queue's hash tag)."""
    read: ScriptCall = ("window/read", [queue_keys(slug).win], [*WINDOW_FIELDS, f"gap:{ticket_epoch}"])
    if limit is None:
        return Plan((read,), lambda replies: (_window(replies[0], ticket_epoch), None))
    return Plan((limit.call, read), lambda replies: (_window(replies[1], ticket_epoch), LimitReply.parse(replies[0])))


def _window(raw: Sequence[Any], ticket_epoch: int) -> Window:
    return Window.parse(raw[:-1], raw[-1], ticket_epoch)


def window_read(slug: str, *, ticket_epoch: int = 0) -> Window:
    """The window in one HMGET (with the gap of the asking ticket's epoch; 0: no ticket asks)."""
    return _window(client().hmget(queue_keys(slug).win, [*WINDOW_FIELDS, f"gap:{ticket_epoch}"]), ticket_epoch)


def window_join_plan(
    slug: str, *, now_ms: int, pow_bits: int = 0, pow_id: str = "", pow_ttl_ms: int = 0, limit: LimitCall | None = None
) -> Plan[tuple[tuple[str, Window] | None, LimitReply | None]]:
    """A stateless join: (outcome, the window after it; when created, the ticket's number is its
    `next_number`, read in the same atomic script). With `limit`, its rate limiter first in the same
    script, and a refused join goes no further (None; the limiter's key under the queue's hash tag)."""
    keys = queue_keys(slug)
    call: ScriptCall = (
        "window/join",
        [keys.win, keys.tagged(f"pow:{pow_id}")],
        [now_ms, pow_bits, pow_ttl_ms, *WINDOW_FIELDS],
    )

    def joined(reply: Any) -> tuple[str, Window]:
        outcome, raw = reply
        return str(outcome), Window.parse(raw or [None] * len(WINDOW_FIELDS))

    if limit is None:
        return Plan((call,), lambda replies: (joined(replies[0]), None))
    return Plan(
        (limit.call, call),
        lambda replies: (joined(replies[1]) if len(replies) > 1 else None, LimitReply.parse(replies[0])),
        gated=True,
    )


@dataclass(frozen=True)
class WindowStep(Reply):
    """window/tick.lua: {outcome, stepped 0|1, last active place, last issued place, moved at (ms), evseq}."""

    outcome: str  # ok | not_leader | no_config
    stepped: bool
    active: int
    issued: int
    at_ms: int
    evseq: int


def window_tick(slug: str, *, now_ms: int, leader_token: str = "") -> WindowStep:
    keys = queue_keys(slug)
    return WindowStep.parse(run("window/tick", [keys.win, keys.leader], [now_ms, leader_token]))


def window_config_write(slug: str, fields: dict[str, Any], gaps: dict[int, int], *, digest: str = "") -> LiveState:
    """Mirror what the window needs of the policy into its HASH; read back its epoch and last number.
    `digest`: of the whole mirror, written into the policy's HASH after the window (state.config_held)."""
    mapping: dict[Any, Any] = {k: ("" if v is None else str(v)) for k, v in fields.items()}
    mapping.update({f"gap:{epoch}": str(gap) for epoch, gap in gaps.items()})
    return window_live_state(slug, mapping=mapping, digest=digest)


def window_live_state(slug: str, *, mapping: dict[Any, Any] | None = None, digest: str = "") -> LiveState:
    """The window's epoch and last number (after writing `mapping` into it, if given)."""
    keys = queue_keys(slug)
    key = keys.win
    pipe = client().pipeline(transaction=False)
    if mapping:
        pipe.hset(key, mapping=mapping)
    if digest:
        pipe.hset(keys.cfg, "digest", digest)
    pipe.hmget(key, ["live", "next"])
    *_, (epoch, number) = pipe.execute()
    return LiveState(int(epoch) if epoch else None, int(number or 0))


def window_epoch_start(slug: str, *, epoch: int, floor: int, seq_max: int, active: int, gap: int, now_ms: int) -> bool:
    started = run("window/epoch", [queue_keys(slug).win], [str(epoch), floor, seq_max, active, gap, now_ms])
    return bool(int(started))


def window_prequeue_close(slug: str, *, seed: str) -> tuple[int, int] | None:
    """At the start: fix the pre-queue's range of numbers (pq_first..the last issued) and reveal the seed
    that shuffles it; the window restarts just before it. None when nobody joined the pre-queue."""
    key = queue_keys(slug).win
    first, number, gap = client().hmget(key, ["pq_first", "next", "gap"])
    if not first:
        return None
    last = int(number or 0)
    client().hset(key, mapping={"pq_last": last, "seed": seed, "active": int(first) - 1 - int(gap or 0)})
    return int(first), last


def window_capacity_report(slug: str, *, in_use: int, now_ms: int) -> None:
    client().hset(queue_keys(slug).win, mapping={"reported_in_use": in_use, "reported_at": now_ms})


def window_token_bind(
    slug: str, *, token_id: str, binding: str, expires_ms: int, epoch: int, queue_id: int = 0, rebind: bool = False
) -> str:
    """Stateless mode keeps no sessions, so an access token is bound to the first browser that presents it
    by a key of its own, gone when the token expires. 'ok' when `binding` may use the token, 'bound_elsewhere'
    when another browser holds it, 'void' when it was signed for an epoch this window does not know (a sale
    before a change of mode) or another queue of the same slug (`queue_id`, 0: not said)."""
    keys = queue_keys(slug)
    key = keys.tagged(f"bind:s{token_id}")
    argv = [binding, max(expires_ms, 1), "1" if rebind else "0", epoch, queue_id]
    return str(run("window/bind", [key, keys.win], argv))
