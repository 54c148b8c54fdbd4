"""Keeping Redis in step with the database (SPEC 3.6): the policy mirrored where every script reads it,
the live state's epoch started when Redis has none (a new queue, or lost state), sequence numbers
reserved ahead, and, after a loss, earlier tickets given back their places."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import redis
from django.conf import settings
from django.db import transaction

from .. import clock, flows, realtime, selectors, shuffle, store
from ..models import Queue
from .audit import queue_change_record
from .errors import QueueNotFound

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _never(reply: object) -> bool:
    return False


def with_policy(slug: str, call: Callable[[], T], missing: Callable[[T], bool] = _never, *, mode: str = "") -> T:
    """Run a script or a read; if the queue's policy is missing from Redis (`missing` says so of the
    reply, or the read raised selectors.PolicyMissing), sync it from the database once and run it again.
    QueueNotFound when the database has no such queue (or, with `mode`, none in that mode).

    Redis normally has it (every save and every tick writes it), so the hot paths need no SQL. This is
    the one place that loads a queue's configuration into Redis on demand (`policy_flow`, which this runs
    from synchronous code).
    """
    return flows.drive(policy_flow(slug, lambda: flows.done(call), missing, mode=mode))


def policy_flow(
    slug: str, call: Callable[[], flows.Flow[T]], missing: Callable[[T], bool] = _never, *, mode: str = ""
) -> flows.Flow[T]:
    """`with_policy` as a flow: `call` gives the read's flow, run once more after the sync if it must be."""
    try:
        reply = yield from call()
        if not missing(reply):
            return reply
    except selectors.PolicyMissing:
        pass
    yield from flows.blocking(lambda: _policy_sync(slug, mode))
    try:
        return (yield from call())
    except selectors.PolicyMissing as exc:  # synced, yet Redis has no policy: nothing to serve it from
        raise QueueNotFound(slug) from exc


def _policy_sync(slug: str, mode: str) -> None:
    queue = Queue.objects.prefetch_related(*Queue.MIRROR_READS).filter(slug=slug).first()
    if queue is None or (mode and queue.mode != mode):
        raise QueueNotFound(slug)
    queue_config_sync(queue)


def needs_sync(reply: store.TicketReply | store.AdmitReply) -> bool:
    # no_seq: the reserved sequence numbers ran out before a tick topped them up; the sync reserves more.
    return reply.outcome in ("no_config", "no_seq")


def queue_config_sync(
    queue: Queue, *, now: float | None = None, unless_held: bool = False, held: store.Held | None = None
) -> store.Held | None:
    """Mirror the queue's policy into Redis, where joins, polls and ticks read it; start the live state's
    epoch if Redis has none (a new queue, or lost state) and keep sequence numbers reserved ahead.

    `unless_held` (the tick's, each second for every queue): write only when Redis does not hold this very
    mirror (its digest differs: a change saved without the service, a change Redis took whose commit then
    failed, a Redis that lost it). Writing it unchanged every second cost each queue config.lua's run.
    `held`: what the caller read Redis to hold already (store.configs_held: the every-queue tick's, one read
    for all), which implies `unless_held`. Returns what Redis held (store.Held) when it held this mirror and
    its live state needed nothing; else None.
    """
    mirror = _Mirror.of(queue)
    if held is None and unless_held:
        held = store.config_held(queue.slug, window=queue.is_stateless)
    if held is not None and held.digest != mirror.digest:
        held = None
    live = _config_write(queue, mirror, now=now) if held is None else held.live
    if live.epoch != queue.epoch or queue.seq_reserved - live.seq < settings.WR_SEQ_BLOCK // 2:
        queue_live_state_ensure(queue.pk, now=now)
        return None
    return held


class _Mirror(NamedTuple):
    """What Redis holds of a queue's row: the policy every script reads, and a stateless queue's window."""

    policy: dict[str, Any]
    window: dict[str, Any] | None
    gaps: dict[int, int]
    digest: str  # of all the above but the time of writing, and the scripts' library: the same row, the same digest

    @classmethod
    def of(cls, queue: Queue) -> _Mirror:
        policy = {**queue.policy(), "seq_max": queue.seq_reserved, "leader_ttl_ms": settings.WR_LEADER_TTL_MS}
        # Until the pre-queue's shuffle is done nobody is admitted: its order is not yet the one to follow.
        # (The tick's query says whether it is, as `shuffle_waits`, for every queue at once.)
        pending = getattr(queue, "shuffle_waits", None)
        if pending is None:
            pending = (
                queue.starts_at is not None
                and queue.shuffles.filter(starts_at=queue.starts_at, revealed_at__isnull=True).exists()
            )
        policy["shuffle_pending"] = "1" if pending else "0"
        window = None
        gaps: dict[int, int] = {}
        if queue.is_stateless:
            window = {
                "state": queue.state,
                "size": queue.window_size,
                "interval_ms": queue.window_interval * 1000,
                "windows": queue.active_windows,
                "starts_ms": policy["starts_at_ms"],
                "ends_ms": policy["ends_at_ms"],
                "prequeue_ms": policy["prequeue_opens_at_ms"],
                "target_url": queue.target_url,
                "session_ttl": queue.session_ttl,
                "shuffle_pending": policy["shuffle_pending"],
                "name": queue.name,
                "max": queue.seq_reserved,
                "max_waiting": queue.max_waiting,
                "pow": queue.pow_difficulty,
                "capacity": queue.capacity,
                "capacity_source": queue.capacity_source,
                "qid": queue.pk,  # (tickets carry it: a queue made again under this slug voids the old ones)
            }
            gaps = {int(epoch): int(gap) for epoch, gap in queue.window_gaps.items()}
        # With the scripts' library's name (a digest of its code): a new release's scripts may keep the
        # policy otherwise (lua/_policy.lua packs it in its own layout), so each queue's is written once more.
        text = json.dumps([store.library().name, policy, window, sorted(gaps.items())], sort_keys=True, default=str)
        return cls(policy, window, gaps, hashlib.blake2b(text.encode(), digest_size=12).hexdigest())


def _config_write(queue: Queue, mirror: _Mirror | None = None, *, now: float | None = None) -> store.LiveState:
    """Write the policy (and, in stateless mode, what the window needs of it); the live state's epoch
    and last number as Redis has them. The digest is written last, with the policy (config.lua) or after
    the window: one that Redis holds says that all of it was written."""
    mirror = mirror or _Mirror.of(queue)
    policy = {**mirror.policy, "synced_at": int(time.time() if now is None else now)}
    if mirror.window is None:
        policy["digest"] = mirror.digest
    live = store.config_write(queue.slug, policy)
    if live.state_changed:  # told by whichever write changed it in Redis: once per change
        realtime.send([realtime.queue_state(queue.slug, live.state_changed)])
    if mirror.window is None:
        return live
    if not live.taken:  # an older copy of the queue than the one Redis holds: the window keeps the newer
        return store.window_live_state(queue.slug)
    return store.window_config_write(queue.slug, mirror.window, mirror.gaps, digest=mirror.digest)


def queue_live_state_ensure(queue_pk: int, *, now: float | None = None, switched: bool = False) -> Queue:
    """Start the live state's epoch in Redis if it is not running, and reserve sequence numbers ahead.

    Redis without the queue's epoch has either never held this queue, or lost its state (a flush, a
    failover to an empty replica, a restart without persistence), or has it on another server than the
    one the epoch began on (a replica promoted, a restart from the append-only file: the writes of the
    last moments before may be missing). After a loss the next epoch begins:
    numbering resumes above everything the database had reserved (so no number is issued twice), and
    for a while (the abandon timeout) tickets and sessions of earlier epochs are given back their places
    as their holders return, ahead of everyone who joins afterwards; in stateless mode the window resumes
    where the tick last saw it. The row lock makes one process do it. `switched`: the epoch was bumped on
    purpose (a change of mode), so this is no loss.
    """
    now = time.time() if now is None else now
    block = settings.WR_SEQ_BLOCK
    with transaction.atomic():
        queue = Queue.objects.select_for_update().get(pk=queue_pk)
        tracked, window = store.live_state(queue.slug), store.window_live_state(queue.slug)
        live = window if queue.is_stateless else tracked
        if live.epoch == queue.epoch:
            if queue.seq_reserved - live.seq < block // 2:
                queue.seq_reserved = max(queue.seq_reserved, live.seq) + block
                queue.save(update_fields=["seq_reserved"])
        else:
            # Nothing in Redis although numbers were handed out, or Redis from another epoch: a new epoch.
            lost = not switched and (live.epoch is not None or queue.seq_reserved > 0)
            before = queue.epoch
            floor = max(queue.seq_reserved, tracked.seq, window.seq)
            if lost:
                queue.epoch = max(queue.epoch, live.epoch or 0) + 1
            queue.seq_reserved = floor + block
            # Found on another server (a failover, a restart from the append-only file): the state survived
            # but for its last moments' writes, the sessions with it, so admissions are not held.
            moved = bool(tracked.moved_from)
            if _live_epoch_start(queue, floor=floor, lost=lost, moved=moved, now=now) and lost:
                what = "Redis lost the queue's live state"
                if moved:
                    what = "the queue's live state is on another Redis server"
                queue_change_record(
                    queue,
                    action="epoch",
                    before={"epoch": before},
                    after={
                        "epoch": queue.epoch,
                        "sequence_floor": floor,
                        "admissions_held_seconds": 0 if moved else restore_hold_seconds(queue),
                    },
                    actor=None,
                    actor_label=f"recovery: {what}",
                )
                logger.warning("queue %s: %s; epoch %s begins", queue.slug, what, queue.epoch)
    fresh = Queue.objects.prefetch_related(*Queue.MIRROR_READS).get(pk=queue_pk)
    _config_write(fresh)
    return fresh


def _live_epoch_start(queue: Queue, *, floor: int, lost: bool, moved: bool = False, now: float) -> bool:
    """Save the queue's new epoch and reservation, and start the epoch in Redis (inside the row lock)."""
    if queue.is_stateless:
        # Places continue where the last epoch's left off: this epoch skips the numbers up to the floor.
        queue.window_gaps = {**queue.window_gaps, str(queue.epoch): floor - queue.window_issued}
        queue.save(update_fields=["epoch", "seq_reserved", "window_gaps"])
        return store.window_epoch_start(
            queue.slug,
            epoch=queue.epoch,
            floor=floor,
            seq_max=queue.seq_reserved,
            active=queue.window_active,
            gap=queue.window_gaps[str(queue.epoch)],
            now_ms=clock.now_ms(now),
        )
    queue.save(update_fields=["epoch", "seq_reserved"])
    priors = [
        (store.walk_prior_seed, _prior_or_none(queue, walk_prior, "walking away"), "walking away"),
        (store.hold_prior_seed, _prior_or_none(queue, hold_prior, "holding slots"), "holding slots"),
    ]
    started = store.epoch_start(
        queue.slug,
        epoch=queue.epoch,
        floor=floor,
        seq_max=queue.seq_reserved,
        restore_until_ms=int((now + queue.abandon_timeout) * 1000) if lost else 0,
        hold_until_ms=int((now + restore_hold_seconds(queue)) * 1000) if lost and not moved else 0,
        places=_shuffled_places(queue) if lost else None,
        # Tickets noted finished before the loss get no place or session back (a few seconds' worst).
        finished=list(queue.finished_tickets.values_list("seq", flat=True)) if lost else (),
    )
    for seed, values, what in priors:
        if not started or values is None:
            continue
        try:
            seed(queue.slug, values)
        except redis.RedisError as exc:  # the queue then learns from its own record alone
            logger.warning("queue %s: no record of %s taken: %s", queue.slug, what, exc)
    return started


# A queue that has seen nobody go would tell its first crowd waits in which nobody walks away (its first
# burst was told 1.10 of its waits where 40 % walked away, bench/RESULTS.md). So a queue's record of walking
# away begins from those of the operator's WALK_PRIOR_QUEUES most recently changed queues that have admitted
# anyone (lua/walk_prior.lua): their sums pooled, so each band of time waited has their rate, scaled to
# WALK_PRIOR_SECONDS of waiting, a few visitors' weight that the queue's own departures and line outweigh
# within its first minute. A queue whose state was lost begins from them too. With no such queue, it
# begins from a crowd of which WR_WALK_PRIOR_SHARE (a fifth) walk away in their first 40 s (walk_default),
# at the same weight: nothing tells a first queue's first burst whether anyone will walk away until a
# presence timeout after the first walk, and a fifth is the middle of the 0-40 % the estimate is built for.
# Begun from nobody walking away, the simulator's forty-percent sale's first burst was told 1.10 of its
# waits (six runs pooled, p90 error 36 %); begun from a fifth, 1.00 (16 %), and the first burst of a sale
# in which nobody walks away 0.95 (p90 9 %, against 8 %) (bench/RESULTS.md).
WALK_PRIOR_QUEUES = 50
WALK_PRIOR_SECONDS = 300.0
WALK_SUMS = 2 * 8  # lua/_walkaways.lua: walked away and seconds waited, per band of HAZARD_BANDS
WALK_DEFAULT_WITHIN_S, WALK_DEFAULT_BANDS, WALK_DEFAULT_MOST = 40.0, 3, 0.9  # the bands of 0-10, 10-20, 20-30 s


def walk_prior(queue: Queue) -> list[float] | None:
    """The pooled, scaled sums a queue's record of walking away begins from; when no other queue has one,
    the default crowd's (walk_default; None: nobody walks away). A record that does not read as WALK_SUMS
    finite numbers is left out (one in the form of the bands before: its queue rewrites it at its next
    departure)."""
    others = Queue.objects.filter(mode=Queue.Mode.TRACKED).exclude(pk=queue.pk).order_by("-updated_at")
    found = store.walk_records(list(others.values_list("slug", flat=True)[:WALK_PRIOR_QUEUES]))
    records = [sums for sums in (_sums(text, WALK_SUMS) for text in found.values()) if sums is not None]
    pooled = [sum(column) for column in zip(*records, strict=True)]
    waited = sum(pooled[1::2])
    if waited <= 0:
        return walk_default()
    scale = min(1.0, WALK_PRIOR_SECONDS / waited)
    return [x * scale for x in pooled]


def walk_default() -> list[float] | None:
    """The sums of a crowd of which WR_WALK_PRIOR_SHARE walk away in their first WALK_DEFAULT_WITHIN_S
    seconds, at one rate, over WALK_PRIOR_SECONDS of waiting spread evenly over the bands of the first
    WALK_DEFAULT_BANDS; None for a share of 0 (nobody walks away)."""
    share = min(WALK_DEFAULT_MOST, max(0.0, float(settings.WR_WALK_PRIOR_SHARE)))
    if share <= 0:
        return None
    rate = -math.log(1 - share) / WALK_DEFAULT_WITHIN_S
    seconds = WALK_PRIOR_SECONDS / WALK_DEFAULT_BANDS
    return [rate * seconds, seconds] * WALK_DEFAULT_BANDS + [0.0, 0.0] * (WALK_SUMS // 2 - WALK_DEFAULT_BANDS)


def _sums(text: str, count: int) -> list[float] | None:
    """`count` finite numbers of 0 or more, as a queue's record keeps them; None for anything else."""
    try:
        sums = [float(x) for x in text.split()]
    except ValueError:
        return None
    if len(sums) != count or not all(math.isfinite(x) and x >= 0 for x in sums):
        return None
    return sums


# A queue that has had no slot back cannot say how long its sessions last, so a crowd that fills its
# capacity at once is told no wait until the first comes back (in the simulator's capacity-bound sale,
# ten seconds and more). So its record of holding slots begins from those of the operator's most recently
# changed queues that have had slots back (lua/hold_prior.lua): their holds given back and the slot-seconds
# spent, per band of time held, pooled and scaled to HOLD_PRIOR_HOLDS holds, and the mean of their mean
# holds weighted by their holds given back. The queue's own slots, those still held as much as those given
# back, outweigh them within its first holds (the life table weighs the slot-seconds its held slots spend:
# a crowd that holds its slots longer than the others' did is seen to within seconds). With no such queue
# there is no default: how long a site's sessions last is the site's, and the first says "working it out".
HOLD_PRIOR_HOLDS = 5.0  # a few holds: the life table is worked out from the first look (HOLDS_FIRST, 3)
HOLD_BANDS = 28  # lua/_holds.lua HOLD_NB


def hold_prior(queue: Queue) -> list[float] | None:
    """[mean hold in ms, holds given back per band .., slot-seconds per band .., claim wait from the line
    in ms or -1] pooled from the others' records and scaled to HOLD_PRIOR_HOLDS holds; None when no other
    queue has had a slot back. A record that does not read as finite numbers of the bands' form is left
    out. Only queues that count their sessions: a site that reports its own count is never seen to hold a
    slot here (its estimate takes the observed pace)."""
    if queue.capacity_source != Queue.CapacitySource.COUNTED:
        return None
    others = Queue.objects.filter(mode=Queue.Mode.TRACKED, capacity_source=Queue.CapacitySource.COUNTED)
    others = others.exclude(pk=queue.pk).order_by("-updated_at")
    found = store.hold_records(list(others.values_list("slug", flat=True)[:WALK_PRIOR_QUEUES]))
    records = [record for record in map(_hold_record, found.values()) if record is not None]
    given = sum(sum(h) for _, h, _, _ in records)
    if given <= 0:
        return None
    mean = sum(m * sum(h) for m, h, _, _ in records) / given
    scale = HOLD_PRIOR_HOLDS / given
    pooled = [sum(column) * scale for column in zip(*(h + x for _, h, x, _ in records), strict=True)]
    # the claim wait of those let in from the line (a join's is shorter: lua/_holds.lua claim_shift)
    claimed = [(c, sum(h)) for _, h, _, c in records if c is not None]
    weight = sum(w for _, w in claimed)
    claim = sum(c * w for c, w in claimed) / weight if weight > 0 else -1.0
    return [mean, *pooled, claim]


def _hold_record(
    record: tuple[str, str, str, str | None],
) -> tuple[float, list[float], list[float], float | None] | None:
    """(mean ms, given back per band, slot-seconds per band, claim wait from the line in ms or None) of one
    queue's record, or None."""
    mean, given, spent = _sums(record[0], 1), _sums(record[1], HOLD_BANDS), _sums(record[2], HOLD_BANDS + 1)
    if mean is None or given is None or spent is None or mean[0] <= 0:
        return None
    claim = _sums(record[3] or "", 2)  # "<mean ms> <count>"
    return mean[0], given, spent[1:], claim[0] if claim else None  # (svx begins with the time of its last look)


def _prior_or_none(queue: Queue, prior: Callable[[Queue], list[float] | None], what: str) -> list[float] | None:
    """A prior, or None when it cannot be had: it is a head start, never a reason for a queue's live state
    not to start (worked out before the epoch starts, in a savepoint of its own)."""
    try:
        with transaction.atomic():
            return prior(queue)
    except Exception:  # anything: the queue then begins from its own record alone
        logger.warning("queue %s: no record of %s from the other queues", queue.slug, what, exc_info=True)
        return None


def restore_hold_seconds(queue: Queue) -> float:
    """How long a new epoch after lost state admits nobody new, so that the sessions that were live (their
    number went with the state; at most capacity) take their slots back first as their holders' requests
    verify. Never longer than an old access token can still be good for."""
    return float(min(settings.WR_RESTORE_HOLD_SECONDS, queue.claim_ttl + queue.session_ttl, queue.abandon_timeout))


def _shuffled_places(queue: Queue) -> dict[int, float]:
    """The line scores the pre-queue shuffle gave its tickets (their places), if a shuffle was revealed."""
    record = queue.shuffles.filter(revealed_at__isnull=False).order_by("-starts_at").first()
    return shuffle.shuffled_places([int(seq) for seq in record.order]) if record else {}
