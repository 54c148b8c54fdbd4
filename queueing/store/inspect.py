"""Reads of a tracked queue's live state for stats, the dashboard, admin and tools (no transition):
counters and sizes, ticket records, line and slot members, sessions, wait samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack

from .connection import client, raw_client, run
from .keys import parse_ticket_id, queue_keys, ticket_id
from .state import record_hashes
from .tracked import TicketStatus


@dataclass(frozen=True)
class QueueSnapshot:
    config: dict[str, str]
    stats: dict[str, str]
    waiting: int  # in line, including those parked as absent
    admitted: int
    active: int
    finished_retained: int
    away: int
    head_seq: int | None = None  # the sequence number at the head of the line (next in); None: empty


def snapshot(slug: str) -> QueueSnapshot:
    """Counters and sizes of one queue in one round trip."""
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    pipe.hgetall(keys.cfg)
    pipe.hgetall(keys.st)
    pipe.hmget(keys.line_tree, "n", "head")
    pipe.zcard(keys.claims)
    pipe.zcard(keys.sessions)
    pipe.zcard(keys.done)
    pipe.zcard(keys.away)
    cfg, st, (line, first), admitted, active, done, away = pipe.execute()
    head = cast(list[str], client().zrange(keys.line_bucket(first), 0, 0)) if first is not None else []
    head_id = parse_ticket_id(head[0]) if head else None
    line = line or 0
    counts = (int(line) + int(away), int(admitted), int(active), int(done), int(away))
    return QueueSnapshot(cfg, st, *counts, head_seq=head_id[0] if head_id else None)


@dataclass(frozen=True)
class TicketRecord:
    """A ticket's record as lua/_lib.lua `save()` packs it (msgpack array; R_* indexes there)."""

    visitor_key: str
    seq: int
    status: TicketStatus
    priority: int
    joined_ms: int
    seen_s: int
    display_name: str
    reason: str
    line_score: float | None  # kept while parked (absent at the head)

    # Where each field sits in the packed array (R_SEQ = 1, ... in _lib.lua, less one).
    SEQ, STATUS, PRIORITY, JOINED, SEEN, NAME, REASON, SCORE = 0, 1, 2, 3, 4, 5, 12, 13

    @property
    def ticket_id(self) -> str:
        return ticket_id(self.seq, self.visitor_key)

    @classmethod
    def parse(cls, visitor_key: str, fields: Sequence[Any]) -> TicketRecord:
        return cls(
            visitor_key=visitor_key,
            seq=int(fields[cls.SEQ]),
            status=TicketStatus(int(fields[cls.STATUS])),
            priority=int(fields[cls.PRIORITY]),
            joined_ms=int(fields[cls.JOINED]),
            seen_s=int(fields[cls.SEEN]),
            display_name=str(fields[cls.NAME]),
            reason=str(fields[cls.REASON]) if len(fields) > cls.REASON and fields[cls.REASON] else "",
            line_score=_number(fields[cls.SCORE]) if len(fields) > cls.SCORE else None,
        )


def _number(value: Any) -> float | None:
    """A record field that may be unset: `false` holds the place of a field not set before a later one."""
    return None if value is None or value is False else float(value)


def ticket_records(slug: str) -> list[TicketRecord]:
    """Every ticket record of a queue, decoded (for checks and tools, not for request paths)."""
    keys = queue_keys(slug)
    pipe = raw_client().pipeline(transaction=False)  # bytes: records are msgpack
    for name in [keys.tk, *record_hashes(slug)]:
        pipe.hgetall(name)
    found: dict[str, bytes] = {}
    for rows in pipe.execute():
        found.update({vk.decode(): packed for vk, packed in rows.items()})
    return [TicketRecord.parse(vk, msgpack.unpackb(packed, raw=False)) for vk, packed in found.items()]


def line_read(slug: str, start: int = 0, stop: int = -1) -> tuple[int, list[tuple[str, float]]]:
    """(everyone in line, [(ticket id, score), ...] at places start .. stop, inclusive) in line order: the
    line is kept in buckets (lua/_line.lua, line_add), read by lua/line.lua."""
    count, flat = run("line", queue_keys(slug).script_keys(), [start, stop])
    return int(count), [(str(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)]


def line_count(slug: str) -> int:
    """Everyone in line (not those parked as absent)."""
    return int(client().hget(queue_keys(slug).line_tree, "n") or 0)


def line_members(slug: str, start: int = 0, stop: int = -1) -> list[str]:
    return [tid for tid, _ in line_read(slug, start, stop)[1]]


def line_scores(slug: str) -> dict[str, float]:
    return dict(line_read(slug)[1])


def away_members(slug: str) -> list[str]:
    return cast(list[str], client().zrange(queue_keys(slug).away, 0, -1))


def slot_members(slug: str) -> tuple[list[str], list[str]]:
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    pipe.zrange(keys.claims, 0, -1)
    pipe.zrange(keys.sessions, 0, -1)
    claims, sessions = pipe.execute()
    return list(claims), list(sessions)


def sessions_list(slug: str, *, limit: int) -> list[tuple[str, str, int]]:
    """(ticket id, 'admitted' | 'active', claim deadline or session end in ms), soonest first."""
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    pipe.zrange(keys.claims, 0, limit - 1, withscores=True)
    pipe.zrange(keys.sessions, 0, limit - 1, withscores=True)
    claims, sessions = pipe.execute()
    found = [(str(t), "admitted", int(s)) for t, s in claims] + [(str(t), "active", int(s)) for t, s in sessions]
    return sorted(found, key=lambda row: row[2])[:limit]


@dataclass(frozen=True)
class WaitSample:
    """One admission: when its ticket joined, when it was admitted, the wait it was told at join, and
    whether admission stopped while it waited (_transitions.lua `admit` pushes "<ticket id> <joined ms>
    <admitted ms> <estimate s or -1>", then " stopped" when a pause or a close began after its join)."""

    ticket_id: str
    joined_ms: int
    admitted_ms: int
    estimated_s: int | None  # None: no estimate at join (paused, closed, no rate yet)
    raw: str = field(default="", compare=False, repr=False)  # as kept in Redis (wait_samples_drop finds it)
    stopped: bool = False  # its wait was lengthened by a stop no estimate could foresee

    @classmethod
    def parse(cls, line: str) -> WaitSample:
        tid, joined, admitted, estimated, *rest = line.split(" ")
        if rest not in ([], ["stopped"]):
            raise ValueError(f"a wait sample of an unknown form: {line!r}")
        est = int(float(estimated))
        return cls(tid, int(float(joined)), int(float(admitted)), est if est >= 0 else None, line, bool(rest))


def wait_samples_read(slug: str, *, limit: int = 10000) -> list[WaitSample]:
    """The oldest `limit` wait samples the admissions left, left in place: once they are stored, drop
    them with wait_samples_drop (so a failed store loses nothing)."""
    lines = cast(list[str], client().lrange(queue_keys(slug).waits, 0, limit - 1))
    return [WaitSample.parse(line) for line in lines]


def wait_samples_drop(slug: str, *, through: WaitSample, read: int) -> int:
    """Drop the samples up to and including `through`, the last of `read` samples stored (atomic)."""
    return int(run("waits_drop", queue_keys(slug).script_keys(), (through.raw, read)))
