"""A queue's policy and the life of its live state: the mirrored policy every script reads, the epoch
the live state runs in (epoch.lua starts it), and dropping state (a deleted queue, a change of mode)."""

from __future__ import annotations

import string
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from .connection import client, run
from .health import health_slice_keys
from .keys import queue_config_pattern, queue_keys


class LiveState(NamedTuple):
    epoch: int | None  # the epoch the live state runs in; None: not started (new queue, or state lost)
    seq: int  # the last sequence number issued
    # The server the epoch began on, when the state was found on another since (lua/_lib.lua
    # server_moved: a failover or a restart from the append-only file; the writes of its last moments may
    # be lost, the rest survived); '' otherwise.
    moved_from: str = ""
    # False when the policy written was an older revision than the one Redis holds (lua/config.lua):
    # its settings were not taken.
    taken: bool = True
    # The queue's new state when this write changed it (lua/config.lua), else ''.
    state_changed: str = ""


class Held(NamedTuple):
    """What a tick reads first of a queue (config_held)."""

    digest: str  # of the policy Redis holds ('' when it holds none)
    live: LiveState
    # Nobody in it: nobody waiting, parked, admitted or in a session (a tracked queue; False for a window).
    empty: bool = False
    # The tick has found it so and noted what its rounds would have come to meanwhile (lua/idle.lua), for
    # the policy Redis holds now (a policy changed since has it noted again).
    idle: bool = False


def config_held(slug: str, *, window: bool = False) -> Held:
    """The digest of the policy Redis holds (written with it: config.lua, window_config_write), the live
    state, and whether anybody is in the queue, in one round trip: what a tick needs to see that nothing is
    to be mirrored, and nothing to be done. `window`: the live state of a stateless queue's window instead
    of the tracked one's."""
    return configs_held([(slug, window)])[0]


def configs_held(queues: Sequence[tuple[str, bool]]) -> list[Held]:
    """config_held for each (slug, window) of many queues, in one round trip: the every-queue tick's first
    read (a round trip a queue was most of what an idle queue cost the worker)."""
    pipe = client().pipeline(transaction=False)
    for slug, window in queues:
        keys = queue_keys(slug)
        pipe.hmget(keys.cfg, "digest", "live_epoch", "server_moved")
        if window:
            pipe.hmget(keys.win, "live", "next")
            continue
        pipe.hmget(keys.st, "seq", "idle", "idle_of")
        pipe.hget(keys.line_tree, "n")
        for key in (keys.claims, keys.sessions, keys.away):
            pipe.zcard(key)
    replies = iter(pipe.execute() if queues else [])
    held: list[Held] = []
    for _, window in queues:
        digest, epoch, moved_from = next(replies)
        if window:
            epoch, seq = next(replies)
            held.append(Held(digest or "", LiveState(int(epoch) if epoch else None, int(seq or 0))))
            continue
        seq, idle, idle_of = next(replies)
        counts = [next(replies) for _ in range(4)]
        live = LiveState(int(epoch) if epoch else None, int(seq or 0), moved_from or "")
        noted = idle is not None and idle_of == digest
        held.append(Held(digest or "", live, empty=not any(int(n or 0) for n in counts), idle=noted))
    return held


def queue_idle(slug: str, *, digest: str, now_ms: int) -> bool:
    """Note a queue nobody is in as idle, for the mirror of its policy with this digest, doing once what the
    ticks' rounds would have come to while they leave it alone (lua/idle.lua); False when it is not to be
    left alone yet (somebody is in it after all, or what its line taught it is still fading)."""
    return bool(run("idle", queue_keys(slug).script_keys(), (now_ms, digest)))


def config_write(slug: str, policy: dict[str, Any]) -> LiveState:
    """Mirror a queue's policy into Redis, where every script reads it (no SQL on the hot path), and
    read back which epoch the live state runs in, in the same round trip."""
    return live_state(slug, policy=policy)


def live_state(slug: str, *, policy: dict[str, Any] | None = None) -> LiveState:
    """The tracked live state's epoch and last sequence number (after writing `policy`, if given: by
    config.lua, which never takes the epoch back)."""
    keys = queue_keys(slug)
    if policy is not None:
        args: list[str] = []
        for name, value in policy.items():
            args += [name, "" if value is None else str(value)]
        epoch, seq, taken, changed = run("config", keys.script_keys(), args)
    else:
        pipe = client().pipeline(transaction=False)
        pipe.hmget(keys.cfg, "live_epoch", "server_moved")
        pipe.hget(keys.st, "seq")
        (epoch, moved_from), seq = pipe.execute()
        return LiveState(int(epoch) if epoch else None, int(seq or 0), moved_from or "")
    return LiveState(int(epoch) if epoch else None, int(seq or 0), taken=bool(int(taken)), state_changed=changed or "")


def epoch_start(
    slug: str,
    *,
    epoch: int,
    floor: int,
    seq_max: int,
    restore_until_ms: int = 0,
    hold_until_ms: int = 0,
    places: dict[int, float] | None = None,
    finished: Sequence[int] = (),
) -> bool:
    """Start the queue's live state in `epoch` (epoch.lua replies 1); False when it was live already (0).
    `places`: pre-queue tickets' line scores; `finished`: tickets not to restore."""
    args: list[str | int | float] = [str(epoch), floor, seq_max, restore_until_ms, hold_until_ms]
    for seq, score in (places or {}).items():
        args += [seq, repr(float(score))]
    for seq in finished:
        args += [seq, "gone"]
    return bool(int(run("epoch", queue_keys(slug).script_keys(), args)))


def walk_records(slugs: Sequence[str]) -> dict[str, str]:
    """The record of walking away ('hz', lua/_walkaways.lua) of each of these queues that has admitted
    anyone, by slug: one round trip (a pipeline; on a cluster, one per master)."""
    if not slugs:
        return {}
    pipe = client().pipeline(transaction=False)
    for slug in slugs:
        pipe.hmget(queue_keys(slug).st, "hz", "admitted")
    found = {}
    for slug, (sums, admitted) in zip(slugs, pipe.execute(), strict=True):
        count = admitted or "0"
        if sums and count.isdigit() and int(count) > 0:
            found[slug] = sums
    return found


def walk_prior_seed(slug: str, sums: Sequence[float]) -> bool:
    """Begin the queue's record of walking away from these sums, unless it has one of its own
    (lua/walk_prior.lua)."""
    return bool(int(run("walk_prior", queue_keys(slug).script_keys(), [f"{x:.6g}" for x in sums])))


def hold_records(slugs: Sequence[str]) -> dict[str, tuple[str, str, str, str | None]]:
    """The record of how long slots are held ('ema_service_ms', 'svh', 'svx', and the claim wait of those
    let in from the line, 'cwl' or None: lua/_holds.lua) of each of these queues that has had a slot
    back, by slug: one round trip (a pipeline)."""
    if not slugs:
        return {}
    pipe = client().pipeline(transaction=False)
    for slug in slugs:
        pipe.hmget(queue_keys(slug).st, "ema_service_ms", "svh", "svx", "cwl")
    return {
        slug: (mean, given, spent, claim)
        for slug, (mean, given, spent, claim) in zip(slugs, pipe.execute(), strict=True)
        if mean and given and spent
    }


def hold_prior_seed(slug: str, values: Sequence[float]) -> bool:
    """Begin the queue's record of how long slots are held from these (the mean hold in ms, the holds given
    back and the slot-seconds per band, then the claim wait from the line in ms or -1), unless it has had a
    slot back (lua/hold_prior.lua)."""
    return bool(int(run("hold_prior", queue_keys(slug).script_keys(), [f"{x:.6g}" for x in values])))


def config_read(slug: str) -> dict[str, str]:
    return cast(dict[str, str], client().hgetall(queue_keys(slug).cfg))


def mode(slug: str) -> str | None:
    """The queue's mode as its mirrored policy says (None when Redis has no policy for it)."""
    value = client().hget(queue_keys(slug).cfg, "mode")
    return None if value is None else str(value)


def pow_difficulty(slug: str) -> int:
    """The queue's proof-of-work difficulty in force (0: no gate), from its mirrored policy."""
    return int(client().hget(queue_keys(slug).cfg, "pow_difficulty") or 0)


def queue_slugs() -> list[str]:
    """Every queue that has a policy in Redis (found by SCAN, not KEYS: it does not block the server; on a
    cluster, SCAN runs on each master in turn). For the orphan sweep only: everything else that goes over
    queues takes them from the database."""
    pattern, prefix = queue_config_pattern()
    return sorted(key[len(prefix) : -len("}:cfg")] for key in client().scan_iter(match=pattern, count=1000))


_VISITOR_KEY_CHARS = string.ascii_letters + string.digits + "_-"  # keys.parse_ticket_id's alphabet


def _kept(slug: str) -> tuple[list[str], list[str]]:
    records, line = run("kept", queue_keys(slug).script_keys(), [_VISITOR_KEY_CHARS])
    return list(records), list(line)


def record_hashes(slug: str) -> list[str]:
    """The small hashes holding a queue's waiting visitors' records (QueueKeys.record), of the 4,160 names
    they can have (lua/kept.lua)."""
    return _kept(slug)[0]


def line_keys(slug: str) -> list[str]:
    """The line's buckets and indexes (lua/_line.lua, line_add; lua/kept.lua)."""
    return _kept(slug)[1]


def queue_delete(slug: str) -> None:
    """Drop all live state of one queue (a deleted queue, or a test)."""
    keys = queue_keys(slug)
    slices = health_slice_keys(slug, newest=int(time.time()))
    records, line = _kept(slug)
    notices = (keys.noticed, keys.notice_due)
    client().delete(*keys.script_keys(), keys.viewers, keys.win, *notices, *slices, *records, *line)


def mode_state_clear(slug: str, *, keep_window: bool) -> None:
    """A queue changed mode: drop the live state of the mode it left (its policy and counters stay)."""
    keys = queue_keys(slug)
    if keep_window:  # now stateless: the tracked line, records and slots go
        tracked = (keys.line, keys.tk, keys.claims, keys.sessions, keys.done, keys.away, keys.waits, keys.restore)
        records, line = _kept(slug)
        client().delete(*tracked, keys.noticed, keys.notice_due, *records, *line)
        client().hdel(keys.st, "notices_seeded")  # the run reads the database's notices again (services/notices.py)
    else:
        client().delete(keys.win)


def finished_journal(slug: str, *, limit: int) -> tuple[int, list[int]]:
    """(cursor, sequence numbers) of tickets finished since the last call (finished.lua); the cursor moves."""
    cursor, seqs = run("finished", queue_keys(slug).script_keys(), [limit])
    return int(cursor), [int(seq) for seq in seqs]
