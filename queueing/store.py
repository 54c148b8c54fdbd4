"""The only module that talks to Redis: the key builder, the client, and one typed wrapper per script.

Each atomic transition is one Lua file in `lua/` (the header of each lists its KEYS, ARGV and reply);
`lua/_lib.lua` is prepended to every script. Scripts run by EVALSHA; redis-py's `Script` reloads a
script the server does not know (NOSCRIPT after a restart or SCRIPT FLUSH) and retries once.

Times cross this boundary as integer milliseconds since the epoch, always supplied by the caller.
"""

from __future__ import annotations

import enum
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, cast

import msgpack
import redis
from django.conf import settings
from redis.commands.core import Script

from . import health

LUA_DIR = Path(__file__).resolve().parent / "lua"
SEQ_DIGITS = 10


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


# --- Keys -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueKeys:
    """Every key of one queue, all under the hash tag `{slug}` so multi-key scripts run on one shard."""

    cfg: str
    st: str
    line: str
    tk: str
    claims: str
    sessions: str
    done: str
    leader: str
    away: str
    waits: str
    restore: str  # places of pre-queue tickets after the shuffle, kept for a while after lost state
    viewers: str  # not a script key: websocket servers report their viewer counts here
    health: str  # not a script key: the prefix of the protected site's health slices (health_slice_key)
    win: str  # stateless mode: the window and its counters, with the policy it needs (lua/window/)

    def script_keys(self) -> list[str]:
        """The KEYS every transition script receives, in the order `_lib.lua` expects."""
        return [
            *(self.cfg, self.st, self.line, self.tk, self.claims, self.sessions, self.done, self.leader, self.away),
            *(self.waits, self.restore),
        ]


@lru_cache(maxsize=4096)
def _queue_keys(prefix: str, slug: str) -> QueueKeys:
    base = f"{prefix}:{{{slug}}}:"
    return QueueKeys(*(base + name for name in QueueKeys.__dataclass_fields__))


def queue_keys(slug: str) -> QueueKeys:
    return _queue_keys(settings.WR_REDIS_PREFIX, slug)


def key_pattern() -> str:
    """A SCAN pattern matching every key this installation writes (tests clean up with it)."""
    return f"{settings.WR_REDIS_PREFIX}:*"


def ticket_id(seq: int, visitor_key: str) -> str:
    return f"{seq:0{SEQ_DIGITS}d}.{visitor_key}"


def parse_ticket_id(value: str) -> tuple[int, str] | None:
    """(seq, visitor key) from a ticket id, or None if it is not one."""
    seq, dot, visitor_key = value.partition(".")
    if not dot or len(seq) != SEQ_DIGITS or not seq.isdigit() or not visitor_key:
        return None
    if len(visitor_key) > 64 or not all(c.isalnum() or c in "-_" for c in visitor_key):
        return None
    return int(seq), visitor_key


# --- Client and scripts -----------------------------------------------------------------------------


class _Connection:
    """One client per process: after a fork (gunicorn, Celery prefork) the child builds its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._url = ""
        self._client: redis.Redis | None = None
        self._scripts: dict[str, Script] = {}

    def get(self) -> tuple[redis.Redis, dict[str, Script]]:
        url = settings.REDIS_URL
        if self._client is None or self._pid != os.getpid() or self._url != url:
            with self._lock:
                if self._client is None or self._pid != os.getpid() or self._url != url:
                    client = redis.Redis.from_url(
                        url,
                        decode_responses=True,
                        socket_timeout=5,
                        socket_connect_timeout=3,
                        health_check_interval=30,
                    )
                    sources = {**_sources(), **_limit_sources()}
                    self._scripts = {name: client.register_script(src) for name, src in sources.items()}
                    self._client, self._pid, self._url = client, os.getpid(), url
        assert self._client is not None
        return self._client, self._scripts


_connection = _Connection()


def client() -> redis.Redis:
    return _connection.get()[0]


_FUNCTION = re.compile(r"^local function ([A-Za-z_][A-Za-z0-9_]*)\(", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _with_library(lib: str, body: str) -> str:
    """The script with the library functions it uses (transitively) in front of it.

    Every EVALSHA runs the whole chunk, and each function definition in it creates a closure: the full
    library costs about 20 µs of Redis time per call, most of a status poll's budget. So each script
    carries only what it calls. Everything before the first function (keys, constants) always goes in.
    """
    starts = [m.start() for m in _FUNCTION.finditer(lib)]
    preamble, blocks = lib[: starts[0]], {}
    for begin, end in zip(starts, [*starts[1:], len(lib)], strict=True):
        block = lib[begin:end]
        # A comment block just above a function belongs to the next function, not this one.
        cut = block.rstrip().rfind("\nend")
        code = block[: cut + 4] if cut >= 0 else block
        blocks[_FUNCTION.match(block).group(1)] = code  # type: ignore[union-attr]
    needed: set[str] = set()
    pending = set(_NAME.findall(body)) & set(blocks)
    while pending:
        name = pending.pop()
        needed.add(name)
        pending |= (set(_NAME.findall(blocks[name])) & set(blocks)) - needed
    used = [code for name, code in blocks.items() if name in needed]
    return preamble + "\n\n".join(used) + "\n\n" + body


@lru_cache(maxsize=1)
def _sources() -> dict[str, str]:
    lib = (LUA_DIR / "_lib.lua").read_text()
    return {
        path.stem: _with_library(lib, path.read_text())
        for path in sorted(LUA_DIR.glob("*.lua"))
        if not path.name.startswith("_")
    }


@lru_cache(maxsize=1)
def _limit_sources() -> dict[str, str]:
    """The rate limiters (lua/limits/) and the stateless window (lua/window/): no queue library."""
    return {
        f"{folder}/{path.stem}": path.read_text()
        for folder in ("limits", "window")
        for path in sorted((LUA_DIR / folder).glob("*.lua"))
    }


def _run(name: str, slug: str, *args: str | int | float) -> Any:
    _, scripts = _connection.get()
    return scripts[name](keys=queue_keys(slug).script_keys(), args=args)


def script(name: str) -> Script:
    """The registered script object (tests use it to exercise NOSCRIPT recovery)."""
    return _connection.get()[1][name]


# --- Replies ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueFigures:
    """What a script saw of the queue when it ran (for estimates, stats and broadcasts)."""

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

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> QueueFigures | None:
        if not raw:
            return None
        return cls(
            state=str(raw[0]),
            capacity=int(raw[1]),
            used=int(raw[2]),
            outflow_per_minute=float(raw[3]),
            ema_rate=float(raw[4]),
            ema_ts_ms=int(float(raw[5])),
            ema_service_ms=float(raw[6]),
            admitted_total=int(raw[7]),
            waiting=int(raw[8]),
            evseq=int(raw[9]),
            presence_timeout_s=int(raw[10]),
            target_url=str(raw[11]),
            epoch=int(raw[12]),
            away=int(raw[13]),
            claim_ttl_s=int(raw[14]),
            starts_at_ms=int(raw[15]),
            name=str(raw[16]),
        )


@dataclass(frozen=True)
class TicketState:
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

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> TicketState:
        rank = int(raw[3])
        est = int(raw[6])
        return cls(
            ticket_id=str(raw[0]),
            seq=int(raw[1]),
            status=TicketStatus(int(raw[2])),
            rank=rank if rank >= 0 else None,
            fence=int(raw[4]),
            expires_ms=int(raw[5]),
            est_wait_s=est if est >= 0 else None,
            reason=str(raw[7] or ""),
            freed=bool(int(raw[8])),
            priority=int(raw[9]),
            score=float(raw[10]) if len(raw) > 10 else None,
        )


@dataclass(frozen=True)
class Moves:
    """How a transition moved other visitors' places: ('-', rank, count) left, ('+', rank, count) placed.

    `seq` is the queue's event sequence after this transition (0 when nobody moved): clients apply
    moves in sequence order and poll when they see a gap.
    """

    seq: int
    ops: list[tuple[str, int, int]]

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> Moves:
        return cls(seq=int(raw[0]), ops=[(str(op), int(rank), int(count)) for op, rank, count in raw[1]])


NO_MOVES = Moves(0, [])


@dataclass(frozen=True)
class TicketReply:
    """A join or status reply. outcome: created | existing | ok | gone | closed | full | no_config | no_seq."""

    outcome: str
    ticket: TicketState | None
    figures: QueueFigures | None
    moves: Moves = NO_MOVES

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> TicketReply:
        outcome = str(raw[0])
        ticket = TicketState.parse(raw[1]) if raw[1] else None
        return cls(outcome=outcome, ticket=ticket, figures=QueueFigures.parse(raw[2]), moves=Moves.parse(raw[3]))


@dataclass(frozen=True)
class Admission:
    ticket_id: str
    fence: int
    expires_ms: int
    joined_ms: int
    est_wait_at_join_s: int | None


@dataclass(frozen=True)
class AdmitReply:
    outcome: str  # ok | not_leader | no_config
    admitted: list[Admission]
    expired: list[str]
    figures: QueueFigures | None
    moves: Moves = NO_MOVES


@dataclass(frozen=True)
class CleanupReply:
    expired_slots: list[str]
    abandoned: list[str]
    pruned: int
    more: bool
    moves: list[Moves] = field(default_factory=list)  # one per round that moved anyone


@dataclass(frozen=True)
class SessionReply:
    result: str
    expires_ms: int
    freed: bool


# --- Transitions (one wrapper per script) -----------------------------------------------------------


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
    _, scripts = _connection.get()
    base = f"{settings.WR_REDIS_PREFIX}:{{{slug}}}:"
    keys = [*queue_keys(slug).script_keys(), f"{base}addr:{address}", f"{base}pow:{pow_id}"]  # KEYS[12], [13]
    args = (visitor_key, now_ms, priority, display_name, int(bool(address)), pow_bits, pow_ttl_ms)
    return TicketReply.parse(scripts["join"](keys=keys, args=args))


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
    return TicketReply.parse(_run("status", slug, visitor_key, seq, now_ms, *restore.args()))


def status_limited(
    slug: str, *, visitor_key: str, seq: int, now_ms: int, limit: LimitCall, restore: Restore = NO_RESTORE
) -> tuple[TicketReply, tuple[bool, int, float, int]]:
    """A status poll and its rate limiter in one round trip (the limiter runs first; a refused poll
    still counts as the visitor's heartbeat)."""
    limited, reply = _evalsha_together(
        [
            (f"limits/{limit.algorithm}", [limit.key], limit.args),
            ("status", queue_keys(slug).script_keys(), (visitor_key, seq, now_ms, *restore.args())),
        ]
    )
    return TicketReply.parse(reply), _limit_reply(limited)


def leave(slug: str, *, visitor_key: str, seq: int, now_ms: int) -> tuple[str, bool, Moves]:
    result, freed, moves = _run("leave", slug, visitor_key, seq, now_ms)
    return str(result), bool(int(freed)), Moves.parse(moves)


def admit(slug: str, *, now_ms: int, leader_token: str = "", max_admit: int, scan_limit: int) -> AdmitReply:
    outcome, admitted, expired, figures, moves = _run("admit", slug, now_ms, leader_token, max_admit, scan_limit)
    return AdmitReply(
        outcome=str(outcome),
        admitted=[
            Admission(
                ticket_id=str(tid),
                fence=int(fence),
                expires_ms=int(expires),
                joined_ms=int(joined),
                est_wait_at_join_s=int(est) if int(est) >= 0 else None,
            )
            for tid, fence, expires, joined, est in admitted
        ],
        expired=[str(t) for t in expired],
        figures=QueueFigures.parse(figures),
        moves=Moves.parse(moves),
    )


def leader(slug: str, *, instance_id: str, ttl_ms: int) -> str | None:
    token = _run("leader", slug, instance_id, ttl_ms)
    return str(token) if token else None


def session_start(
    slug: str, *, visitor_key: str, seq: int, fence: int, now_ms: int, epoch: int = 0, expires_ms: int = 0
) -> SessionReply:
    """With the access token's epoch and expiry, a session lost with the state starts again."""
    result, expires, freed = _run("session_start", slug, visitor_key, seq, fence, now_ms, epoch, expires_ms)
    return SessionReply(result=str(result), expires_ms=int(expires), freed=bool(int(freed)))


def complete(slug: str, *, visitor_key: str, seq: int, fence: int, now_ms: int) -> tuple[str, bool]:
    result, freed = _run("complete", slug, visitor_key, seq, fence, now_ms)
    return str(result), bool(int(freed))


def revoke(slug: str, *, ticket_id: str, now_ms: int) -> tuple[str, bool, Moves]:
    result, freed, moves = _run("revoke", slug, ticket_id, now_ms)
    return str(result), bool(int(freed)), Moves.parse(moves)


def cleanup(slug: str, *, now_ms: int, chunk: int, retention_ms: int) -> CleanupReply:
    expired, abandoned, pruned, more, moves = _run("cleanup", slug, now_ms, chunk, retention_ms)
    parsed = Moves.parse(moves)
    return CleanupReply(
        expired_slots=[str(t) for t in expired],
        abandoned=[str(t) for t in abandoned],
        pruned=int(pruned),
        more=bool(int(more)),
        moves=[parsed] if parsed.seq else [],
    )


@dataclass(frozen=True)
class Neighbour:
    rank: int
    display_name: str
    is_me: bool
    priority: int


def neighbours(slug: str, *, visitor_key: str, seq: int, before: int, after: int) -> tuple[int | None, list[Neighbour]]:
    """The visitor's rank and the few visitors around it, in line order (None when not in line)."""
    rank, rows = _run("neighbours", slug, visitor_key, seq, before, after)
    if int(rank) < 0:
        return None, []
    return int(rank), [Neighbour(int(r), str(name), bool(int(me)), int(pri)) for r, name, me, pri in rows]


def capacity_report(slug: str, *, in_use: int, now_ms: int) -> tuple[int, int, str] | None:
    raw = _run("capacity", slug, in_use, now_ms)
    if not raw:
        return None
    return int(raw[0]), int(raw[1]), str(raw[2])


# --- Plain reads and writes (no transition) ---------------------------------------------------------


class LiveState(NamedTuple):
    epoch: int | None  # the epoch the live state runs in; None: not started (new queue, or state lost)
    seq: int  # the last sequence number issued


def config_write(slug: str, policy: dict[str, Any]) -> LiveState:
    """Mirror a queue's policy into Redis, where every script reads it (no SQL on the hot path), and
    read back which epoch the live state runs in, in the same round trip."""
    return live_state(slug, policy=policy)


def live_state(slug: str, *, policy: dict[str, Any] | None = None) -> LiveState:
    """The tracked live state's epoch and last sequence number (after writing `policy`, if given)."""
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    if policy is not None:
        pipe.hset(keys.cfg, mapping={k: ("" if v is None else str(v)) for k, v in policy.items()})
    pipe.hget(keys.cfg, "live_epoch")
    pipe.hget(keys.st, "seq")
    *_, epoch, seq = pipe.execute()
    return LiveState(int(epoch) if epoch else None, int(seq or 0))


def epoch_start(
    slug: str,
    *,
    epoch: int,
    floor: int,
    seq_max: int,
    restore_until_ms: int = 0,
    places: dict[int, float] | None = None,
) -> bool:
    """Start the queue's live state in `epoch` (epoch.lua); False when it was live already."""
    args: list[str | int | float] = [str(epoch), floor, seq_max, restore_until_ms]
    for seq, score in (places or {}).items():
        args += [seq, repr(float(score))]
    return bool(int(_run("epoch", slug, *args)))


def config_read(slug: str) -> dict[str, str]:
    return cast(dict[str, str], client().hgetall(queue_keys(slug).cfg))


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
    pipe.zcard(keys.line)
    pipe.zcard(keys.claims)
    pipe.zcard(keys.sessions)
    pipe.zcard(keys.done)
    pipe.zcard(keys.away)
    pipe.zrange(keys.line, 0, 0)
    cfg, st, line, admitted, active, done, away, head = pipe.execute()
    head_id = parse_ticket_id(head[0]) if head else None
    counts = (int(line) + int(away), int(admitted), int(active), int(done), int(away))
    return QueueSnapshot(cfg, st, *counts, head_seq=head_id[0] if head_id else None)


@dataclass(frozen=True)
class TicketRecord:
    visitor_key: str
    seq: int
    status: TicketStatus
    priority: int
    joined_ms: int
    seen_s: int
    display_name: str
    reason: str
    line_score: float | None  # kept while parked (absent at the head)

    @property
    def ticket_id(self) -> str:
        return ticket_id(self.seq, self.visitor_key)


def ticket_records(slug: str) -> list[TicketRecord]:
    """Every ticket record of a queue, decoded (for checks and tools, not for request paths)."""
    raw_client = redis.Redis.from_url(settings.REDIS_URL)  # bytes: records are msgpack
    try:
        raw: dict[bytes, bytes] = raw_client.hgetall(queue_keys(slug).tk)  # type: ignore[assignment]
    finally:
        raw_client.close()
    records = []
    for vk, packed in raw.items():
        fields = msgpack.unpackb(packed, raw=False)
        records.append(
            TicketRecord(
                visitor_key=vk.decode(),
                seq=int(fields[0]),
                status=TicketStatus(int(fields[1])),
                priority=int(fields[2]),
                joined_ms=int(fields[3]),
                seen_s=int(fields[4]),
                display_name=str(fields[5]),
                reason=str(fields[12]) if len(fields) > 12 and fields[12] else "",
                line_score=float(fields[13]) if len(fields) > 13 else None,
            )
        )
    return records


def line_members(slug: str, start: int = 0, stop: int = -1) -> list[str]:
    return cast(list[str], client().zrange(queue_keys(slug).line, start, stop))


def line_scores(slug: str) -> dict[str, float]:
    pairs = cast(list[tuple[str, float]], client().zrange(queue_keys(slug).line, 0, -1, withscores=True))
    return dict(pairs)


def away_members(slug: str) -> list[str]:
    return cast(list[str], client().zrange(queue_keys(slug).away, 0, -1))


def slot_members(slug: str) -> tuple[list[str], list[str]]:
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    pipe.zrange(keys.claims, 0, -1)
    pipe.zrange(keys.sessions, 0, -1)
    claims, sessions = pipe.execute()
    return list(claims), list(sessions)


def queue_slugs() -> list[str]:
    """Every queue that has a policy in Redis (found by SCAN, not KEYS: it does not block the server)."""
    prefix = f"{settings.WR_REDIS_PREFIX}:{{"
    return sorted(
        key[len(prefix) : -len("}:cfg")]
        for key in client().scan_iter(match=f"{settings.WR_REDIS_PREFIX}:{{*}}:cfg", count=1000)
    )


def queue_delete(slug: str) -> None:
    """Drop all live state of one queue (a deleted queue, or a test)."""
    keys = queue_keys(slug)
    newest = int(time.time())
    slices = [health_slice_key(slug, second) for second in range(newest - health.KEEP_SECONDS, newest + 2)]
    client().delete(*keys.script_keys(), keys.viewers, keys.win, *slices)


def mode_state_clear(slug: str, *, keep_window: bool) -> None:
    """A queue changed mode: drop the live state of the mode it left (its policy and counters stay)."""
    keys = queue_keys(slug)
    if keep_window:  # now stateless: the tracked line, records and slots go
        client().delete(keys.line, keys.tk, keys.claims, keys.sessions, keys.done, keys.away, keys.waits, keys.restore)
    else:
        client().delete(keys.win)


@dataclass(frozen=True)
class WaitSample:
    """One admission: when its ticket joined, when it was admitted, and the wait it was told at join."""

    ticket_id: str
    joined_ms: int
    admitted_ms: int
    estimated_s: int | None  # None: no estimate at join (paused, closed, no rate yet)
    raw: str = field(default="", compare=False, repr=False)  # as kept in Redis (wait_samples_drop finds it)


def wait_samples_read(slug: str, *, limit: int = 10000) -> list[WaitSample]:
    """The oldest `limit` wait samples the admissions left, left in place: once they are stored, drop
    them with wait_samples_drop (so a failed store loses nothing)."""
    samples = []
    for line in cast(list[str], client().lrange(queue_keys(slug).waits, 0, limit - 1)):
        ticket_id, joined, admitted, estimated = line.split(" ")
        est = int(float(estimated))
        sample = WaitSample(ticket_id, int(float(joined)), int(float(admitted)), est if est >= 0 else None, line)
        samples.append(sample)
    return samples


def wait_samples_drop(slug: str, *, through: WaitSample, read: int) -> int:
    """Drop the samples up to and including `through`, the last of `read` samples stored (atomic)."""
    return int(_run("waits_drop", slug, through.raw, read))


def sessions_list(slug: str, *, limit: int) -> list[tuple[str, str, int]]:
    """(ticket id, 'admitted' | 'active', claim deadline or session end in ms), soonest first."""
    keys = queue_keys(slug)
    pipe = client().pipeline(transaction=False)
    pipe.zrange(keys.claims, 0, limit - 1, withscores=True)
    pipe.zrange(keys.sessions, 0, limit - 1, withscores=True)
    claims, sessions = pipe.execute()
    found = [(str(t), "admitted", int(s)) for t, s in claims] + [(str(t), "active", int(s)) for t, s in sessions]
    return sorted(found, key=lambda row: row[2])[:limit]


def prequeue_entries(slug: str, *, joined_before_ms: int) -> list[tuple[str, int, int]]:
    """(ticket id, sequence number, priority level) of the tickets waiting that joined before then."""
    return [(str(t), int(seq), int(pri)) for t, seq, pri in _run("prequeue", slug, joined_before_ms)]


def reorder(slug: str, places: list[tuple[str, float]], *, now_ms: int) -> tuple[int, int]:
    """Give waiting tickets new line scores; returns (tickets moved, the new event sequence)."""
    args: list[str | int | float] = [now_ms]
    for ticket_id, score in places:
        args += [ticket_id, score]
    moved, seq = _run("reorder", slug, *args)
    return int(moved), int(seq)


def outflow_adapt(slug: str, *, now_ms: int, leader_token: str, verdict: str) -> tuple[str, float, float]:
    """Apply one verdict of the adaptive outflow (outflow_adapt.lua): (outcome, rate before, rate after)."""
    outcome, before, after = _run("outflow_adapt", slug, now_ms, leader_token, verdict)
    return str(outcome), float(before), float(after)


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


# --- The protected site's health (see health.py) --------------------------------------------------------


def health_slice_key(slug: str, second: int) -> str:
    """The protected site's responses reported in one second (a HASH: n requests, e errors, b<i> histogram
    bucket counts), kept health.KEEP_SECONDS."""
    return f"{queue_keys(slug).health}:{second}"


def health_report(slug: str, *, now_ms: int, requests: int, errors: int, buckets: dict[int, int]) -> None:
    """Add one report to the current second's counts.

    Pure increments with no decision to take, so a MULTI/EXEC pipeline is as atomic as a script would be
    (the counts and the expiry land together or not at all, in one round trip): no Lua file needed.
    """
    key = health_slice_key(slug, now_ms // 1000)
    pipe = client().pipeline(transaction=True)
    pipe.hincrby(key, "n", requests)
    if errors:
        pipe.hincrby(key, "e", errors)
    for index, count in buckets.items():
        pipe.hincrby(key, f"b{index}", count)
    pipe.expire(key, health.KEEP_SECONDS)
    pipe.execute()


def health_window(slug: str, *, now_ms: int, seconds: int) -> health.SiteHealth:
    """The site's responses reported in the last `seconds` seconds (the current one included), summed."""
    newest = now_ms // 1000
    pipe = client().pipeline(transaction=False)
    for second in range(newest - seconds + 1, newest + 1):
        pipe.hgetall(health_slice_key(slug, second))
    requests = errors = 0
    buckets: dict[int, int] = {}
    for counts in pipe.execute():
        for field_name, value in counts.items():
            if field_name == "n":
                requests += int(value)
            elif field_name == "e":
                errors += int(value)
            elif field_name.startswith("b"):
                index = int(field_name[1:])
                buckets[index] = buckets.get(index, 0) + int(value)
    return health.SiteHealth.from_counts(window_seconds=seconds, requests=requests, errors=errors, buckets=buckets)


def pow_difficulty(slug: str) -> int:
    """The queue's proof-of-work difficulty in force (0: no gate), from its mirrored policy."""
    return int(client().hget(queue_keys(slug).cfg, "pow_difficulty") or 0)


# --- Rate limiting ------------------------------------------------------------------------------------


def limit_key(scope: str, ident: str) -> str:
    """The key of one limited subject (a client address, a ticket, an API key, a user) in one scope."""
    return f"{settings.WR_REDIS_PREFIX}:rl:{scope}:{{{ident}}}"


class LimitCall(NamedTuple):
    algorithm: str
    key: str
    args: tuple[str | int | float, ...]


def _limit_reply(raw: Sequence[Any]) -> tuple[bool, int, float, int]:
    allowed, retry_ms, remaining, wait_ms = raw
    return bool(int(allowed)), int(retry_ms), float(remaining), int(wait_ms)


def limit_hit(algorithm: str, key: str, *args: str | int | float) -> tuple[bool, int, float, int]:
    """Run one limiter script: (allowed, retry after ms, remaining or weighted count, wait ms)."""
    _, scripts = _connection.get()
    return _limit_reply(scripts[f"limits/{algorithm}"](keys=[key], args=args))


def _evalsha_together(
    calls: list[tuple[str, list[str], tuple[Any, ...]]], then: Callable[[Any], None] | None = None
) -> list[Any]:
    """Several scripts (and, with `then`, plain commands added to the pipeline after them) in one round
    trip (a plain pipeline of EVALSHA: redis-py's script pipelines would add a SCRIPT EXISTS round trip
    each time). A server that lost its scripts gets them loaded, once."""
    client, scripts = _connection.get()
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(scripts[name].sha, len(keys), *keys, *args)
        if then is not None:
            then(pipe)
        try:
            return list(pipe.execute())
        except redis.exceptions.NoScriptError:
            if attempt == 2:
                raise
            for name, _, _ in calls:
                scripts[name].sha = client.script_load(scripts[name].script)
    raise AssertionError("unreachable")


VIEWERS_FRESH_SECONDS = 15


def viewers_report(counts: dict[str, int], *, instance: str, now: float) -> None:
    """A websocket server's count of open sockets per queue (its own field; read with viewers_count)."""
    pipe = client().pipeline(transaction=False)
    for slug, count in counts.items():
        pipe.hset(queue_keys(slug).viewers, instance, f"{count}:{int(now)}")
    pipe.execute()


def viewers_count(slug: str, *, now: float) -> int:
    """Sockets watching a queue, summed over websocket servers that reported in the last 15 s."""
    key = queue_keys(slug).viewers
    total, stale = 0, []
    for instance, value in cast(dict[str, str], client().hgetall(key)).items():
        count, _, at = value.partition(":")
        if now - float(at or 0) > VIEWERS_FRESH_SECONDS:
            stale.append(instance)
        else:
            total += int(count)
    if stale:
        client().hdel(key, *stale)  # servers that stopped reporting (stopped, or crashed)
    return total


# --- Stateless mode (SPEC 4): numbered tickets and a sliding window ----------------------------------------
#
# One HASH per queue (`win`) holds the counters (next number, last active place, when the window last
# moved, ...) and the policy fields this mode needs, mirrored by config sync, so that a status is one
# HMGET. Nothing is stored per visitor.

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
    ticket_gap: int = 0  # the gap of the epoch the asking ticket was issued in

    @classmethod
    def parse(cls, raw: Sequence[Any], ticket_gap: Any = "current") -> Window:
        """`ticket_gap`: the asking ticket's epoch's gap as read (None: that epoch skipped nothing), or
        "current" for a ticket of the current epoch (a join)."""
        v = dict(zip(WINDOW_FIELDS, raw, strict=True))
        if ticket_gap == "current":
            ticket_gap = v["gap"]

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
            ticket_gap=int(float(ticket_gap or 0)),
        )


def window_read(slug: str, *, ticket_epoch: int = 0) -> Window:
    """The window in one HMGET (with the gap of the asking ticket's epoch)."""
    raw = client().hmget(queue_keys(slug).win, [*WINDOW_FIELDS, f"gap:{ticket_epoch}"])
    return Window.parse(raw[:-1], raw[-1])


def window_read_limited(
    slug: str, *, ticket_epoch: int, limit: LimitCall
) -> tuple[Window, tuple[bool, int, float, int]]:
    """The window and the asking ticket's rate limiter, in one round trip."""
    fields = [*WINDOW_FIELDS, f"gap:{ticket_epoch}"]
    limited, raw = _evalsha_together(
        [(f"limits/{limit.algorithm}", [limit.key], limit.args)],
        then=lambda pipe: pipe.hmget(queue_keys(slug).win, fields),
    )
    return Window.parse(raw[:-1], raw[-1]), _limit_reply(limited)


def window_join(
    slug: str, *, now_ms: int, pow_bits: int = 0, pow_id: str = "", pow_ttl_ms: int = 0
) -> tuple[str, Window]:
    """A stateless join: (outcome, the window after it; when created, the ticket's number is its
    `next_number`, read in the same atomic script)."""
    _, scripts = _connection.get()
    base = f"{settings.WR_REDIS_PREFIX}:{{{slug}}}:"
    keys = [queue_keys(slug).win, f"{base}pow:{pow_id}"]
    outcome, raw = scripts["window/join"](keys=keys, args=[now_ms, pow_bits, pow_ttl_ms, *WINDOW_FIELDS])
    return str(outcome), Window.parse(raw or [None] * len(WINDOW_FIELDS))


class WindowStep(NamedTuple):
    outcome: str  # ok | not_leader | no_config
    stepped: bool
    active: int
    issued: int
    at_ms: int
    evseq: int


def window_tick(slug: str, *, now_ms: int, leader_token: str = "") -> WindowStep:
    _, scripts = _connection.get()
    keys = queue_keys(slug)
    outcome, stepped, active, issued, at, evseq = scripts["window/tick"](
        keys=[keys.win, keys.leader], args=[now_ms, leader_token]
    )
    return WindowStep(str(outcome), bool(int(stepped)), int(active), int(issued), int(at), int(evseq))


def window_config_write(slug: str, fields: dict[str, Any], gaps: dict[int, int]) -> LiveState:
    """Mirror what the window needs of the policy into its HASH; read back its epoch and last number."""
    mapping: dict[Any, Any] = {k: ("" if v is None else str(v)) for k, v in fields.items()}
    mapping.update({f"gap:{epoch}": str(gap) for epoch, gap in gaps.items()})
    return window_live_state(slug, mapping=mapping)


def window_live_state(slug: str, *, mapping: dict[Any, Any] | None = None) -> LiveState:
    """The window's epoch and last number (after writing `mapping` into it, if given)."""
    key = queue_keys(slug).win
    pipe = client().pipeline(transaction=False)
    if mapping:
        pipe.hset(key, mapping=mapping)
    pipe.hmget(key, ["live", "next"])
    *_, (epoch, number) = pipe.execute()
    return LiveState(int(epoch) if epoch else None, int(number or 0))


def window_epoch_start(slug: str, *, epoch: int, floor: int, seq_max: int, active: int, gap: int, now_ms: int) -> bool:
    _, scripts = _connection.get()
    started = scripts["window/epoch"](
        keys=[queue_keys(slug).win], args=[str(epoch), floor, seq_max, active, gap, now_ms]
    )
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
