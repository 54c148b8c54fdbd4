"""Admission and what the clock does (tracked mode): the leader lease, the admission tick, cleanup,
capacity reports, the pre-queue's reordering and the adaptive outflow; one wrapper per script, each with
the parser of its reply.

leader.lua, admit.lua, cleanup.lua, capacity.lua, prequeue.lua, reorder.lua, outflow_adapt.lua.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .connection import client, run
from .keys import queue_keys
from .replies import Reply, maybe, optional, texts
from .tracked import NO_MOVES, Moves, QueueFigures


def _run(name: str, slug: str, *args: str | int | float) -> Any:
    return run(name, queue_keys(slug).script_keys(), args)


def leader(slug: str, *, instance_id: str, ttl_ms: int) -> str | None:
    """Take or keep the queue's leader lease: the lease token '<instance>:<term>', or None."""
    token = _run("leader", slug, instance_id, ttl_ms)
    return str(token) if token else None


@dataclass(frozen=True)
class Admission(Reply):
    """One admitted ticket: {tid, fence, expires_ms, joined_ms, est_wait_at_join_s or -1}."""

    ticket_id: str
    fence: int
    expires_ms: int
    joined_ms: int
    est_wait_at_join_s: int | None

    CONVERT = {"est_wait_at_join_s": optional}


@dataclass(frozen=True)
class AdmitReply(Reply):
    """admit.lua: {outcome, admitted, expired, figures, moves}."""

    outcome: str  # ok | not_leader | no_config | no_seq
    admitted: list[Admission]
    expired: list[str]
    figures: QueueFigures | None
    moves: Moves = NO_MOVES

    CONVERT = {
        "admitted": lambda rows: [Admission.parse(row) for row in rows],
        "expired": texts,
        "figures": maybe(QueueFigures.parse),
        "moves": Moves.parse,
    }


def admit(
    slug: str, *, now_ms: int, leader_token: str = "", max_admit: int, scan_limit: int, model_every_ms: int = 1000
) -> AdmitReply:
    return AdmitReply.parse(_run("admit", slug, now_ms, leader_token, max_admit, scan_limit, model_every_ms))


def _moved(raw: Sequence[Any]) -> list[Moves]:
    moves = Moves.parse(raw)
    return [moves] if moves.seq else []


@dataclass(frozen=True)
class CleanupReply(Reply):
    """cleanup.lua: {expired_slots, abandoned, pruned, more 0|1, moves} (one round; services sum rounds)."""

    expired_slots: list[str]
    abandoned: list[str]
    pruned: int
    more: bool
    moves: list[Moves] = field(default_factory=list)  # one per round that moved anyone

    CONVERT = {"expired_slots": texts, "abandoned": texts, "moves": _moved}


def cleanup(slug: str, *, now_ms: int, chunk: int, retention_ms: int) -> CleanupReply:
    return CleanupReply.parse(_run("cleanup", slug, now_ms, chunk, retention_ms))


@dataclass(frozen=True)
class CapacityReply(Reply):
    """capacity.lua: {capacity, used, capacity_source} after the report ({} without a policy)."""

    capacity: int
    used: int
    source: str


def capacity_report(slug: str, *, in_use: int, now_ms: int) -> CapacityReply | None:
    return maybe(CapacityReply.parse)(_run("capacity", slug, in_use, now_ms))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class PrequeueEntry(Reply):
    """prequeue.lua, per ticket: {ticket id, sequence number, priority level}."""

    ticket_id: str
    seq: int
    priority: int


def prequeue_entries(slug: str, *, joined_before_ms: int) -> list[PrequeueEntry]:
    """The tickets waiting that joined before then."""
    return [PrequeueEntry.parse(row) for row in _run("prequeue", slug, joined_before_ms)]


def reorder(slug: str, places: list[tuple[str, float]], *, now_ms: int) -> tuple[int, int]:
    """Give waiting tickets new line scores; reorder.lua replies {tickets moved, the new event sequence}."""
    args: list[str | int | float] = [now_ms]
    for ticket_id, score in places:
        args += [ticket_id, score]
    moved, seq = _run("reorder", slug, *args)
    return int(moved), int(seq)


@dataclass(frozen=True)
class OutflowAdaptReply(Reply):
    """outflow_adapt.lua: {outcome, rate before, rate after} (admissions a minute)."""

    outcome: str
    before: float
    after: float


def outflow_adapt(slug: str, *, now_ms: int, leader_token: str, verdict: str) -> OutflowAdaptReply:
    """Apply one verdict of the adaptive outflow."""
    return OutflowAdaptReply.parse(_run("outflow_adapt", slug, now_ms, leader_token, verdict))


def outflow_adapt_state(slug: str) -> tuple[dict[str, str], int]:
    """The queue's mirrored policy and when its outflow was last adapted (ms; 0 never), in one round trip."""
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    pipe.hgetall(keys.cfg)
    pipe.hget(keys.st, "outflow_adapted_at")
    config, adapted_at = pipe.execute()
    return config, int(float(adapted_at or 0))


def outflow_reset(slug: str, *, now_ms: int) -> float | None:
    """Forget the adapted outflow (the scripts fall back to the configured one) and start the next
    adjustment interval now; returns the adapted rate that was in force, if any. MULTI/EXEC: atomic."""
    st = queue_keys(slug).st
    pipe = client().pipeline(transaction=True)
    pipe.hget(st, "outflow_effective")
    pipe.hdel(st, "outflow_effective")
    pipe.hset(st, "outflow_adapted_at", now_ms)
    previous, _, _ = pipe.execute()
    return float(previous) if previous is not None else None
