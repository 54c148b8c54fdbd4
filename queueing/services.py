"""Every write: queue configuration, joins, leaves, admission, sessions, cleanup.

A service performs one transition (one Lua script via `store`), and afterwards whatever that
transition causes: a freed slot runs admission at once (seed 004) rather than waiting for the tick, and
the live events go out (`realtime`: admitted, expired, queue_move). Services take `now` (seconds since
the epoch) so that tests can drive the clock; callers in production leave it out.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest
from django.utils import timezone

from . import health, pow, realtime, selectors, shuffle, store, tokens
from .models import PriorityCode, PriorityLevel, Queue, QueueAPIKey, QueueChange, QueueShuffle

logger = logging.getLogger(__name__)
T = TypeVar("T")

EDITABLE_FIELDS = ("name", "target_url", "state", *Queue.POLICY_FIELDS)


class QueueNotOpen(Exception):
    """The queue's pre-queue has not opened yet."""


class ProofOfWorkRequired(Exception):
    """The queue's gate is on and the join showed no (or too little) proof of work."""

    def __init__(self, difficulty: int) -> None:
        super().__init__(difficulty)
        self.difficulty = difficulty


class ProofOfWorkReused(Exception):
    """The challenge was already spent on a join."""


class TicketCapReached(Exception):
    """The client address already holds the queue's max_tickets_per_address live tickets."""


class QueueNotFound(Exception):
    pass


class QueueClosed(Exception):
    pass


class QueueFull(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__("The queue is full.")
        self.retry_after = retry_after


class InvalidPriorityCode(Exception):
    pass


class TicketNotFound(Exception):
    pass


# What a join may be refused with (the API maps each to its error code).
JOIN_REFUSALS = (
    QueueNotOpen,
    ProofOfWorkRequired,
    ProofOfWorkReused,
    TicketCapReached,
    QueueNotFound,
    QueueClosed,
    QueueFull,
    InvalidPriorityCode,
)


class QueueIsStateless(Exception):
    """The queue runs in stateless mode: it is joined with queue_join_stateless."""


class QueueIsTracked(Exception):
    """The queue runs in tracked mode (it changed a moment ago): it is joined with queue_join."""


class NotInStatelessMode(Exception):
    """What was asked needs per-visitor state, which a stateless queue does not keep."""


def _now_ms(now: float | None) -> int:
    return int((time.time() if now is None else now) * 1000)


# --- Configuration ---------------------------------------------------------------------------------


def _snapshot(queue: Queue) -> dict[str, Any]:
    return {field: getattr(queue, field) for field in EDITABLE_FIELDS}


def _audit(queue: Queue, *, action: str, before: dict[str, Any], actor: Any, actor_label: str) -> None:
    after = _snapshot(queue)
    if action == "create":  # nothing before: the entry records every value the queue was created with
        changed_before, changed_after = {}, after
    else:
        changed_before = {k: v for k, v in before.items() if after.get(k) != v}
        changed_after = {k: after[k] for k in changed_before}
    if not changed_before and action == "update":
        return
    queue_change_record(
        queue, action=action, before=changed_before, after=changed_after, actor=actor, actor_label=actor_label
    )


def queue_change_record(
    queue: Queue, *, action: str, before: dict[str, Any], after: dict[str, Any], actor: Any, actor_label: str = ""
) -> QueueChange:
    """Write one entry of the audit log (who, what, before, after, when)."""
    user = actor if isinstance(actor, get_user_model()) else None
    return QueueChange.objects.create(
        queue=queue,
        actor=user,
        actor_label=actor_label or (user.get_username() if user else "system"),
        action=action,
        before=before,
        after=after,
    )


def queue_config_sync(queue: Queue, *, now: float | None = None) -> None:
    """Mirror the queue's policy into Redis, where joins, polls and ticks read it; start the live state's
    epoch if Redis has none (a new queue, or lost state) and keep sequence numbers reserved ahead."""
    live = _config_write(queue)
    if live.epoch != queue.epoch or queue.seq_reserved - live.seq < settings.WR_SEQ_BLOCK // 2:
        queue_live_state_ensure(queue.pk, now=now)


def _config_write(queue: Queue) -> store.LiveState:
    """Write the policy (and, in stateless mode, what the window needs of it); the live state's epoch
    and last number as Redis has them."""
    policy = {
        **queue.policy(),
        "seq_max": queue.seq_reserved,
        "leader_ttl_ms": settings.WR_LEADER_TTL_MS,
        "synced_at": int(time.time()),
    }
    # Until the pre-queue's shuffle is done nobody is admitted: its order is not yet the one to follow.
    pending = (
        queue.starts_at is not None
        and queue.shuffles.filter(starts_at=queue.starts_at, revealed_at__isnull=True).exists()
    )
    policy["shuffle_pending"] = "1" if pending else "0"
    live = store.config_write(queue.slug, policy)
    if not queue.is_stateless:
        return live
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
    }
    gaps = {int(epoch): int(gap) for epoch, gap in queue.window_gaps.items()}
    return store.window_config_write(queue.slug, window, gaps)


# --- Lost Redis state: epochs and reserved sequence numbers (SPEC 3.6) --------------------------------


def queue_live_state_ensure(queue_pk: int, *, now: float | None = None, switched: bool = False) -> Queue:
    """Start the live state's epoch in Redis if it is not running, and reserve sequence numbers ahead.

    Redis without the queue's epoch has either never held this queue, or lost its state (a flush, a
    failover to an empty replica, a restart without persistence). After a loss the next epoch begins:
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
            if _live_epoch_start(queue, floor=floor, lost=lost, now=now) and lost:
                queue_change_record(
                    queue,
                    action="epoch",
                    before={"epoch": before},
                    after={"epoch": queue.epoch, "sequence_floor": floor},
                    actor=None,
                    actor_label="recovery: Redis lost the queue's live state",
                )
                logger.warning("queue %s: Redis lost its live state; epoch %s begins", queue.slug, queue.epoch)
    fresh = Queue.objects.prefetch_related("priority_levels").get(pk=queue_pk)
    _config_write(fresh)
    return fresh


def _live_epoch_start(queue: Queue, *, floor: int, lost: bool, now: float) -> bool:
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
            now_ms=_now_ms(now),
        )
    queue.save(update_fields=["epoch", "seq_reserved"])
    return store.epoch_start(
        queue.slug,
        epoch=queue.epoch,
        floor=floor,
        seq_max=queue.seq_reserved,
        restore_until_ms=int((now + queue.abandon_timeout) * 1000) if lost else 0,
        places=_shuffled_places(queue) if lost else None,
    )


def _shuffled_places(queue: Queue) -> dict[int, float]:
    """The line scores the pre-queue shuffle gave its tickets (their places), if a shuffle was revealed."""
    record = queue.shuffles.filter(revealed_at__isnull=False).order_by("-starts_at").first()
    return {int(seq): float(place) for place, seq in enumerate(record.order)} if record else {}


# --- Schedule: pre-queue, auditable shuffle, end (SPEC 2, 3.3) -----------------------------------------


def shuffle_commit_ensure(queue: Queue) -> QueueShuffle | None:
    """Commit to a random seed for the queue's scheduled start (its hash is published at once); a
    changed start gets a new commitment, and unrevealed ones for other starts are dropped."""
    if queue.starts_at is None:
        QueueShuffle.objects.filter(queue=queue, revealed_at__isnull=True).delete()
        return None
    QueueShuffle.objects.filter(queue=queue, revealed_at__isnull=True).exclude(starts_at=queue.starts_at).delete()
    seed = shuffle.seed_new()
    record, _ = QueueShuffle.objects.get_or_create(
        queue=queue,
        starts_at=queue.starts_at,
        defaults={"seed": seed, "commitment": shuffle.commitment_of(seed)},
    )
    return record


def queue_prequeue_shuffle(queue: Queue, *, now: float | None = None) -> QueueShuffle | None:
    """At the start: put the pre-queue in the order the committed seed gives, reveal the seed and
    publish the lists. Runs once per start, however many ticks race to it."""
    now = time.time() if now is None else now
    if queue.starts_at is None:
        return None
    starts_ms = int(queue.starts_at.timestamp() * 1000)
    with transaction.atomic():
        record = (
            QueueShuffle.objects.select_for_update()
            .filter(queue=queue, starts_at=queue.starts_at, revealed_at__isnull=True)
            .first()
        )
        if record is None:
            return None
        if queue.is_stateless:
            # No list of tickets: the pre-queue is a range of numbers, each placed by shuffle.place.
            span = store.window_prequeue_close(queue.slug, seed=record.seed)
            record.numbers = list(span) if span else []
        else:
            entries = store.prequeue_entries(queue.slug, joined_before_ms=starts_ms)
            tickets = sorted((seq, level) for _, seq, level in entries)
            order = shuffle.shuffle_order(record.seed, tickets)
            by_seq = {seq: ticket_id for ticket_id, seq, _ in entries}
            places = [(by_seq[seq], float(place)) for place, seq in enumerate(order)]
            store.reorder(queue.slug, places, now_ms=_now_ms(now))
            record.tickets = [list(t) for t in tickets]
            record.order = order
        record.revealed_at = datetime.fromtimestamp(now, tz=UTC)
        record.save(update_fields=["tickets", "order", "numbers", "revealed_at"])
    queue_config_sync(Queue.objects.prefetch_related("priority_levels").get(pk=queue.pk))
    # Everyone's place changed: the jump in the event sequence makes every page ask for its new one.
    realtime.send([realtime.snapshot(queue.slug, selectors.queue_stats_get(slug=queue.slug, now=now))])
    return record


def queue_schedule_step(slug: str, *, now: float | None = None) -> None:
    """What the clock decides, run by every tick: the shuffle at the start, closing at the end."""
    now = time.time() if now is None else now
    queue = Queue.objects.filter(slug=slug).first()
    if queue is None or queue.state == Queue.State.CLOSED:
        return
    moment = datetime.fromtimestamp(now, tz=UTC)
    if queue.ends_at is not None and moment >= queue.ends_at:
        queue_update(queue, changes={"state": Queue.State.CLOSED}, actor_label="schedule: ends_at")
        # Closed queues get no periodic snapshot: tell the pages now that the line has closed.
        realtime.send([realtime.snapshot(slug, selectors.queue_stats_get(slug=slug, now=now))])
        return
    if queue.starts_at is not None and moment >= queue.starts_at:
        queue_prequeue_shuffle(queue, now=now)


def queue_delete(queue: Queue) -> None:
    """Delete a queue and everything it has in Redis (its line, tickets and sessions end with it)."""
    slug = queue.slug
    queue.delete()
    store.queue_delete(slug)


ORPHAN_GRACE_SECONDS = 60


def queues_orphans_delete(*, now: float | None = None) -> list[str]:
    """Drop the Redis state of queues no longer in the database (deleted without the service).

    Only state not synced for a minute: a queue being created inside a transaction that has not
    committed yet is already in Redis but not yet visible here.
    """
    now = time.time() if now is None else now
    known = set(Queue.objects.values_list("slug", flat=True))
    orphans = []
    for slug in store.queue_slugs():
        synced_at = float(store.config_read(slug).get("synced_at") or 0)
        if slug not in known and now - synced_at > ORPHAN_GRACE_SECONDS:
            store.queue_delete(slug)
            orphans.append(slug)
    return orphans


def queue_priority_levels_ensure(queue: Queue) -> None:
    for level, fraction in PriorityLevel.DEFAULT_FRACTIONS.items():
        PriorityLevel.objects.get_or_create(
            queue=queue,
            level=level,
            defaults={"name": PriorityLevel.Level(level).label, "placement_fraction": fraction},
        )


def _priority_levels(queue: Queue) -> dict[str, dict[str, Any]]:
    return {
        str(level.level): {
            "name": level.name,
            "placement_fraction": level.placement_fraction,
            "group": level.group.name if level.group else None,
        }
        for level in PriorityLevel.objects.filter(queue=queue).select_related("group")
    }


def queue_priority_levels_edit(queue: Queue, *, save: Callable[[], None], actor: Any = None) -> None:
    """Run `save` (admin's inline formsets), then audit the levels it changed and mirror their placement
    fractions into Redis. Levels decide where joiners are placed, so they are audited like the queue."""
    before = _priority_levels(queue)
    save()
    after = _priority_levels(queue)
    changed = sorted(level for level in before.keys() | after.keys() if before.get(level) != after.get(level))
    if changed:
        queue_change_record(
            queue,
            action="priority_levels",
            before={level: before[level] for level in changed if level in before},
            after={level: after[level] for level in changed if level in after},
            actor=actor,
        )
    queue_config_sync(queue)


def queue_configure(
    *, slug: str, changes: dict[str, Any], actor: Any = None, actor_label: str = ""
) -> tuple[Queue, bool]:
    """Create or update a queue; validates like the admin does, audits, and syncs Redis on commit."""
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise ValidationError(dict.fromkeys(sorted(unknown), "Not a queue setting."))
    with transaction.atomic():
        queue = Queue.objects.select_for_update().filter(slug=slug).first()
        created = queue is None
        if queue is None:
            queue = Queue(slug=slug, name=slug)
        before = {} if created else _snapshot(queue)
        for field, value in changes.items():
            setattr(queue, field, value)
        queue.full_clean()
        queue.save()
        if created:
            queue_priority_levels_ensure(queue)
        elif before["mode"] != queue.mode:
            _mode_switch(queue)
        shuffle_commit_ensure(queue)
        _audit(
            queue,
            action="create" if created else "update",
            before=before,
            actor=actor,
            actor_label=actor_label,
        )
    # Mirrored at once rather than on commit: should an outer transaction roll back, the next tick
    # re-mirrors the database's policy within a second; waiting for a commit that test transactions
    # never make would leave Redis behind instead.
    queue_config_sync(Queue.objects.prefetch_related("priority_levels").get(pk=queue.pk))
    if not created and any(before[f] != getattr(queue, f) for f in OUTFLOW_POLICY_FIELDS):
        outflow_adaptation_reset(queue, actor=actor, actor_label=actor_label)
    return queue, created


# Changing any of these starts the adaptive outflow again from the configured outflow.
OUTFLOW_POLICY_FIELDS = ("outflow_per_minute", "adaptive_outflow", "outflow_min_per_minute", "outflow_max_per_minute")


def outflow_adaptation_reset(
    queue: Queue, *, actor: Any = None, actor_label: str = "", now: float | None = None
) -> None:
    """The operator re-tuned the outflow (or turned adaptation on or off): admission follows the
    configured outflow again, and the adaptation, if on, starts from it a full interval later. The jump
    of the rate in force is audited."""
    adapted = store.outflow_reset(queue.slug, now_ms=_now_ms(now))
    if adapted is not None and adapted != queue.outflow_per_minute:
        queue_change_record(
            queue,
            action="outflow_reset",
            before={"outflow_per_minute_effective": round(adapted, 3)},
            after={
                "outflow_per_minute_effective": queue.outflow_per_minute,
                "adaptive_outflow": queue.adaptive_outflow,
            },
            actor=actor,
            actor_label=actor_label,
        )


def _mode_switch(queue: Queue) -> None:
    """A queue changes mode (inside the row lock): the other mode's live state goes, and a new epoch
    starts, so numbering continues above every number issued and nothing of the old mode is restored."""
    queue.epoch += 1
    queue.window_active = queue.window_issued = 0
    queue.window_gaps = {}
    queue.save(update_fields=["epoch", "window_active", "window_issued", "window_gaps"])
    store.mode_state_clear(queue.slug, keep_window=queue.is_stateless)
    queue_live_state_ensure(queue.pk, switched=True)


def queue_update(queue: Queue, *, changes: dict[str, Any], actor: Any = None, actor_label: str = "") -> Queue:
    """Change a queue's settings (the staff API, pause and resume); takes effect on the next tick."""
    updated, _ = queue_configure(slug=queue.slug, changes=changes, actor=actor, actor_label=actor_label)
    return updated


def queue_pause(queue: Queue, *, actor: Any = None, actor_label: str = "") -> Queue:
    return queue_update(queue, changes={"state": Queue.State.PAUSED}, actor=actor, actor_label=actor_label)


def queue_resume(queue: Queue, *, actor: Any = None, actor_label: str = "") -> Queue:
    return queue_update(queue, changes={"state": Queue.State.OPEN}, actor=actor, actor_label=actor_label)


def api_key_create(queue: Queue, *, name: str) -> tuple[QueueAPIKey, str]:
    """A new API key for the queue's protected site; the key itself is returned once, never stored."""
    api_key, key = QueueAPIKey.objects.create_key(queue=queue, name=name)
    return cast(QueueAPIKey, api_key), key


# --- Visitors ----------------------------------------------------------------------------------------


def _with_config(slug: str, call: Callable[[], T], missing: Callable[[T], bool]) -> T:
    """Run a script; if the queue's policy is missing from Redis, sync it from the database once.

    Redis normally has it (every save and every tick writes it), so the hot paths need no SQL.
    """
    reply = call()
    if not missing(reply):
        return reply
    queue = Queue.objects.prefetch_related("priority_levels").filter(slug=slug).first()
    if queue is None:
        raise QueueNotFound(slug)
    queue_config_sync(queue)
    return call()


def _no_config(reply: store.TicketReply | store.AdmitReply) -> bool:
    # no_seq: the reserved sequence numbers ran out before a tick topped them up; the sync reserves more.
    return reply.outcome in ("no_config", "no_seq")


def priority_code_reserve(*, slug: str, code: str) -> int:
    """Take one use of a priority code; returns its level. InvalidPriorityCode if it cannot be used."""
    try:
        # Checked as admin checks codes before any SQL: a NUL or a lone surrogate would fail in the database.
        PriorityCode._meta.get_field("code").run_validators(code)
    except ValidationError as exc:
        raise InvalidPriorityCode(code) from exc
    now = timezone.now()
    usable = PriorityCode.objects.filter(queue__slug=slug, code=code).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )
    # One conditional UPDATE, so parallel joins cannot use a code more often than its limit.
    taken = usable.filter(Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses"))).update(uses=F("uses") + 1)
    if not taken:
        raise InvalidPriorityCode(code)
    return PriorityCode.objects.values_list("level", flat=True).get(queue__slug=slug, code=code)


def priority_code_release(*, slug: str, code: str) -> None:
    PriorityCode.objects.filter(queue__slug=slug, code=code, uses__gt=0).update(uses=F("uses") - 1)


def priority_for_user(*, slug: str, user: AbstractBaseUser | AnonymousUser | None) -> int:
    """The highest level a signed-in user gets from group membership (0 for everyone else)."""
    if user is None or not user.is_authenticated:
        return 0
    level = (
        PriorityLevel.objects.filter(queue__slug=slug, group__user__pk=user.pk)
        .order_by("-level")
        .values_list("level", flat=True)
        .first()
    )
    return int(level or 0)


@dataclass(frozen=True)
class JoinResult:
    created: bool
    reply: store.TicketReply

    @property
    def ticket(self) -> store.TicketState:
        assert self.reply.ticket is not None
        return self.reply.ticket


def queue_join(
    *,
    slug: str,
    visitor_key: str,
    priority: int = 0,
    priority_code: str = "",
    display_name: str = "",
    address: str = "",
    proof: pow.Solved | None = None,
    now: float | None = None,
) -> JoinResult:
    """Give the visitor a ticket, or its existing live one (idempotent per visitor).

    A priority code's use is taken before the join and given back when the visitor already had a ticket,
    so retries never spend a code twice.
    """
    if priority_code:
        priority = max(priority, priority_code_reserve(slug=slug, code=priority_code))
    try:
        reply = _with_config(
            slug,
            lambda: store.join(
                slug,
                visitor_key=visitor_key,
                now_ms=_now_ms(now),
                priority=priority,
                display_name=display_name,
                address=address,
                pow_bits=proof.bits if proof else 0,
                pow_id=proof.challenge_id if proof else "",
                pow_ttl_ms=pow.CHALLENGE_TTL_SECONDS * 1000 + 1000,
            ),
            _no_config,
        )
    except Exception:
        if priority_code:
            priority_code_release(slug=slug, code=priority_code)
        raise
    if priority_code and reply.outcome != "created":
        priority_code_release(slug=slug, code=priority_code)
    if reply.outcome == "stateless":
        raise QueueIsStateless(slug)
    realtime.send(realtime.queue_move(slug, reply.moves, reply.figures.waiting if reply.figures else None))
    if reply.outcome == "closed":
        raise QueueClosed(slug)
    if reply.outcome == "not_open":
        raise QueueNotOpen(slug)
    if reply.outcome == "capped":
        raise TicketCapReached(slug)
    if reply.outcome == "pow_required":
        raise ProofOfWorkRequired(store.pow_difficulty(slug))
    if reply.outcome == "pow_reused":
        raise ProofOfWorkReused(slug)
    if reply.outcome == "full":
        figures = reply.figures
        retry = 30
        if figures is not None and figures.outflow_per_minute > 0:
            retry = max(5, min(300, int(60 * 10 / figures.outflow_per_minute)))
        raise QueueFull(retry)
    assert reply.ticket is not None
    if reply.ticket.freed:
        queue_admit(slug=slug, now=now)
    return JoinResult(created=reply.outcome == "created", reply=reply)


def queue_join_stateless(*, slug: str, proof: pow.Solved | None = None, now: float | None = None) -> store.Window:
    """A new number in a stateless queue (SPEC 4): an increment in Redis, nothing stored per visitor.
    Returns the window as the join left it; the number is `window.next_number`."""
    outcome, window = _with_config(
        slug,
        lambda: store.window_join(
            slug,
            now_ms=_now_ms(now),
            pow_bits=proof.bits if proof else 0,
            pow_id=proof.challenge_id if proof else "",
            pow_ttl_ms=pow.CHALLENGE_TTL_SECONDS * 1000 + 1000,
        ),
        lambda reply: reply[0] in ("no_config", "no_seq"),
    )
    if outcome == "closed":
        raise QueueClosed(slug)
    if outcome == "not_open":
        raise QueueNotOpen(slug)
    if outcome == "pow_required":
        raise ProofOfWorkRequired(store.pow_difficulty(slug))
    if outcome == "pow_reused":
        raise ProofOfWorkReused(slug)
    if outcome == "full":
        raise QueueFull(max(5, min(300, window.interval_ms // 1000)))
    if outcome == "no_config":
        raise QueueIsTracked(slug)  # synced, yet no window: the queue is not (or no longer) stateless
    return window


def queue_window_tick(*, queue: Queue, leader_token: str = "", now: float | None = None) -> store.WindowStep:
    """One step of a stateless queue's window, if one is due (lua/window/tick.lua); tells the watchers
    when it moved, and keeps the database's note of where the window is (for lost state)."""
    step = _with_config(
        queue.slug,
        lambda: store.window_tick(queue.slug, now_ms=_now_ms(now), leader_token=leader_token),
        lambda reply: reply.outcome == "no_config",
    )
    if step.outcome != "ok":
        return step
    if step.stepped:
        realtime.send([realtime.window_moved(queue.slug, selectors.window_public_get(slug=queue.slug, now=now))])
    if (step.active, step.issued) != (queue.window_active, queue.window_issued):
        Queue.objects.filter(pk=queue.pk).update(
            window_active=Greatest(F("window_active"), step.active),
            window_issued=Greatest(F("window_issued"), step.issued),
        )
        queue.window_active, queue.window_issued = step.active, step.issued
    return step


def pow_challenge_issue(*, slug: str) -> dict[str, Any]:
    """A proof-of-work challenge at the queue's difficulty now (no SQL: the policy is in Redis)."""
    config = _with_config(slug, lambda: store.config_read(slug) or None, _none)
    return pow.challenge_issue(slug, int((config or {}).get("pow_difficulty") or 0))


def _none(value: object) -> bool:
    return value is None


def ticket_leave(*, slug: str, claims: tokens.TicketClaims, now: float | None = None) -> bool:
    """The visitor gives up its ticket. Returns False when it had already finished (harmless)."""
    result, freed, moves = store.leave(slug, visitor_key=claims.visitor_key, seq=claims.seq, now_ms=_now_ms(now))
    realtime.send(realtime.queue_move(slug, moves))
    if freed:
        queue_admit(slug=slug, now=now)
    return result == "left"


# --- Admission -----------------------------------------------------------------------------------------


def queue_admit(*, slug: str, now: float | None = None, leader_token: str = "") -> store.AdmitReply:
    """Admit as many as the policy allows. Without a leader token this is the immediate admission a
    freed slot triggers; the bucket and capacity still bound it, so it can never outrun the policy."""
    reply = _with_config(
        slug,
        lambda: store.admit(
            slug,
            now_ms=_now_ms(now),
            leader_token=leader_token,
            max_admit=settings.WR_ADMIT_MAX_PER_CALL,
            scan_limit=settings.WR_ADMIT_MAX_PER_CALL * 4,
        ),
        _no_config,
    )
    messages: list[realtime.Message] = []
    if reply.figures is not None:
        for admission in reply.admitted:
            access_token, redirect_url = selectors.admission_link(
                slug,
                ticket_id=admission.ticket_id,
                fence=admission.fence,
                expires_ms=admission.expires_ms,
                target_url=reply.figures.target_url,
                epoch=reply.figures.epoch,
            )
            messages.append(
                realtime.admitted(
                    slug,
                    admission.ticket_id,
                    access_token=access_token,
                    redirect_url=redirect_url,
                    expires_at=admission.expires_ms // 1000,
                )
            )
        messages += realtime.queue_move(slug, reply.moves, reply.figures.waiting)
    messages += realtime.expired(slug, reply.expired, "expired")
    realtime.send(messages)
    return reply


@dataclass(frozen=True)
class OutflowStep:
    """One step of the adaptive outflow: what the site's health said, and what the script did."""

    outcome: str  # see lua/outflow_adapt.lua: adapted | not_admitting | not_limiting
    verdict: str  # increase | decrease | hold
    reason: str  # healthy | latency | errors | latency_and_errors | no_traffic | too_few_requests
    before: float
    after: float
    window: health.SiteHealth  # the site's health the verdict was judged on

    @property
    def changed(self) -> bool:
        return self.after != self.before


ADAPTIVE_ACTOR = "adaptive outflow"


def queue_outflow_adapt(*, slug: str, leader_token: str, now: float | None = None) -> OutflowStep | None:
    """Follow the protected site's health, once per adjustment interval (the tick calls this while it
    holds the queue's leader lease): cut the outflow by the decrease factor while the site's p95 response
    time or error rate is over its threshold, raise it by the step while healthy, never past the bounds.
    Every change of the rate is audited with the figures that caused it. None when nothing was due."""
    now = time.time() if now is None else now
    now_ms = _now_ms(now)
    config, adapted_at_ms = store.outflow_adapt_state(slug)
    if config.get("adaptive_outflow") != "1":
        return None
    interval = int(config.get("adaptive_interval_seconds") or 10)
    if adapted_at_ms and adapted_at_ms <= now_ms < adapted_at_ms + interval * 1000:
        return None  # not due: the script checks again, atomically; this spares reading the window
    window = selectors.site_health_get(slug=slug, now=now, window_seconds=interval)
    verdict, reason = health.outflow_verdict(window, health.Thresholds.from_config(config))
    outcome, before, after = store.outflow_adapt(slug, now_ms=now_ms, leader_token=leader_token, verdict=verdict)
    if outcome not in ("adapted", "not_admitting", "not_limiting"):
        return None
    step = OutflowStep(outcome, verdict, reason, before, after, window)
    if step.changed:
        queue = Queue.objects.filter(slug=slug).first()
        if queue is not None:
            queue_change_record(
                queue,
                action="outflow_adapted",
                before={"outflow_per_minute_effective": round(before, 3)},
                after={"outflow_per_minute_effective": round(after, 3), "reason": reason, **window.payload()},
                actor=None,
                actor_label=ADAPTIVE_ACTOR,
            )
    return step


def site_health_report(
    *, slug: str, requests: int, errors: int, latencies_ms: list[float], now: float | None = None
) -> None:
    """Count the protected site's responses (require_queue_access, or the health API): how many, how
    many failed (5xx), and their response times (all of them, or a sample standing for all)."""
    if not 0 <= errors <= requests or len(latencies_ms) > max(requests, 0):
        raise ValueError("a health report needs 0 <= errors <= requests and at most one time per request")
    store.health_report(
        slug,
        now_ms=_now_ms(now),
        requests=requests,
        errors=errors,
        buckets=health.histogram(latencies_ms, requests=requests),
    )


def instance_id() -> str:
    """This process's identity for leader election."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _lead(slug: str, *, instance: str | None, now: float | None) -> str | None:
    """Take or keep the queue's leader lease (seed 000); its holder runs what the clock decides. The
    lease token, or None when another instance leads."""
    token = store.leader(slug, instance_id=instance or instance_id(), ttl_ms=settings.WR_LEADER_TTL_MS)
    if token is not None:
        queue_schedule_step(slug, now=now)
    return token


def queue_tick(*, slug: str, instance: str | None = None, now: float | None = None) -> store.AdmitReply | None:
    """One admission tick: only the holder of the queue's leader lease admits (SPEC 3.2)."""
    token = _lead(slug, instance=instance, now=now)
    if token is None:
        return None
    try:
        queue_outflow_adapt(slug=slug, leader_token=token, now=now)
    except Exception:  # admission goes on at the rate in force: adapting is secondary to admitting
        logger.exception("adaptive outflow step failed for queue %s", slug)
    return queue_admit(slug=slug, now=now, leader_token=token)


def queue_window_tick_lead(
    *, queue: Queue, instance: str | None = None, now: float | None = None
) -> store.WindowStep | None:
    """A stateless queue's tick: only the holder of the queue's leader lease moves its window (seed 000)."""
    token = _lead(queue.slug, instance=instance, now=now)
    return None if token is None else queue_window_tick(queue=queue, leader_token=token, now=now)


def queues_tick(*, instance: str | None = None, now: float | None = None) -> int:
    """Tick every queue that is not closed; returns how many visitors were admitted (tracked queues) or
    windows moved (stateless ones)."""
    admitted = 0
    for queue in Queue.objects.exclude(state=Queue.State.CLOSED).prefetch_related("priority_levels"):
        # Re-mirroring the policy each tick heals a Redis that lost it (restart, failover).
        queue_config_sync(queue)
        if queue.is_stateless:
            step = queue_window_tick_lead(queue=queue, instance=instance, now=now)
            admitted += int(step is not None and step.stepped)
            continue
        reply = queue_tick(slug=queue.slug, instance=instance, now=now)
        if reply is not None:
            admitted += len(reply.admitted)
    return admitted


def queue_cleanup(*, slug: str, now: float | None = None, max_rounds: int = 50) -> store.CleanupReply:
    """Expire what is overdue, in bounded rounds; a freed slot runs admission at once."""
    expired: list[str] = []
    abandoned: list[str] = []
    moves: list[store.Moves] = []
    pruned = 0
    more = True
    rounds = 0
    while more and rounds < max_rounds:
        reply = store.cleanup(
            slug,
            now_ms=_now_ms(now),
            chunk=settings.WR_CLEANUP_CHUNK,
            retention_ms=settings.WR_TERMINAL_RETENTION_SECONDS * 1000,
        )
        expired += reply.expired_slots
        abandoned += reply.abandoned
        moves += reply.moves
        pruned += reply.pruned
        more = reply.more
        rounds += 1
    messages = realtime.expired(slug, abandoned, "abandoned") + realtime.expired(slug, expired, "expired")
    for round_moves in moves:
        messages += realtime.queue_move(slug, round_moves)
    realtime.send(messages)
    if expired:
        queue_admit(slug=slug, now=now)
    return store.CleanupReply(expired_slots=expired, abandoned=abandoned, pruned=pruned, more=more, moves=moves)


def queues_snapshot_broadcast(*, now: float | None = None) -> int:
    """Send every watcher of an open or paused queue its periodic snapshot (seed 004)."""
    slugs = Queue.objects.exclude(state=Queue.State.CLOSED).values_list("slug", flat=True)
    return realtime.send(realtime.snapshot(slug, selectors.queue_stats_get(slug=slug, now=now)) for slug in slugs)


def queues_cleanup(*, now: float | None = None) -> int:
    queues_orphans_delete(now=now)
    total = 0
    for slug in Queue.objects.values_list("slug", flat=True):
        reply = queue_cleanup(slug=slug, now=now)
        total += len(reply.expired_slots) + len(reply.abandoned)
    return total


# --- The protected site ----------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    valid: bool
    reason: str  # '' when valid; expired | superseded | revoked | invalid
    ticket_id: str
    expires_at: int  # seconds since the epoch


def session_verify(*, slug: str, raw_token: str, now: float | None = None) -> VerifyResult:
    """Check an access token; its first successful check turns ADMITTED into ACTIVE."""
    try:
        claims = tokens.access_token_decode(raw_token, slug=slug)
    except tokens.InvalidAccessToken as exc:
        return VerifyResult(False, "expired" if exc.expired else "invalid", "", 0)
    if claims.stateless:
        # A stateless queue keeps no sessions (SPEC 4): a token it signed is good until it expires.
        return VerifyResult(True, "", claims.ticket_id, claims.expires_at)
    reply = _with_config(
        slug,
        lambda: store.session_start(
            slug,
            visitor_key=claims.visitor_key,
            seq=claims.seq,
            fence=claims.fence,
            now_ms=_now_ms(now),
            epoch=claims.epoch,
            expires_ms=claims.expires_at * 1000,
        ),
        lambda r: r.result == "no_config",
    )
    if reply.freed:
        queue_admit(slug=slug, now=now)
    if reply.result != "valid":
        return VerifyResult(False, reply.result, claims.ticket_id, 0)
    return VerifyResult(True, "", claims.ticket_id, reply.expires_ms // 1000)


def session_complete(*, slug: str, claims: tokens.AccessClaims, now: float | None = None) -> str:
    """End a session and free its slot at once; the next visitor is admitted without waiting for a tick.

    Returns 'completed', 'already' (completing twice is harmless) or why the session is not live. A
    stateless queue's session holds no slot: completing it changes nothing.
    """
    if claims.stateless:
        return "completed"
    result, freed = store.complete(
        slug, visitor_key=claims.visitor_key, seq=claims.seq, fence=claims.fence, now_ms=_now_ms(now)
    )
    if freed:
        queue_admit(slug=slug, now=now)
    return result


def session_revoke(*, slug: str, ticket_id: str, now: float | None = None) -> str:
    """Throw a visitor out (waiting or in session). Returns 'revoked' or 'already'."""
    if store.parse_ticket_id(ticket_id) is None:
        raise TicketNotFound(ticket_id)
    if selectors.queue_mode_get(slug) == Queue.Mode.STATELESS:
        raise NotInStatelessMode("A stateless queue keeps no tickets or sessions to revoke.")
    result, freed, moves = store.revoke(slug, ticket_id=ticket_id, now_ms=_now_ms(now))
    if result == "not_found":
        raise TicketNotFound(ticket_id)
    if result == "revoked":
        realtime.send(realtime.expired(slug, [ticket_id], "revoked") + realtime.queue_move(slug, moves))
    if freed:
        queue_admit(slug=slug, now=now)
    return result


def capacity_report(*, slug: str, in_use: int, now: float | None = None) -> tuple[int, int, str]:
    """The protected site's own absolute count of sessions in use (seed 001); admits at once if room.

    Returns (capacity, slots in use after that admission, capacity source). A stateless queue's window
    stands still while the site reports itself full (capacity_source = reported)."""
    if selectors.queue_mode_get(slug) == Queue.Mode.STATELESS:
        store.window_capacity_report(slug, in_use=in_use, now_ms=_now_ms(now))
        config = store.config_read(slug)
        return int(config.get("capacity") or 0), in_use, config.get("capacity_source", "counted")
    reply = _with_config(
        slug, lambda: store.capacity_report(slug, in_use=in_use, now_ms=_now_ms(now)), lambda r: r is None
    )
    if reply is None:
        raise QueueNotFound(slug)
    capacity, used, source = reply
    figures = queue_admit(slug=slug, now=now).figures
    if figures is not None:
        capacity, used = figures.capacity, figures.used
    return capacity, used, source
