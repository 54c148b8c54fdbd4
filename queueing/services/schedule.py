"""Scheduled sales (SPEC 2, 3.3): the committed seed of a start, and at the start the auditable shuffle of
the pre-queue. (Closing at the end, and when the shuffle runs, are the admission tick's: admission.py.)"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.db import transaction

from .. import caching, clock, realtime, selectors, shuffle, store
from ..models import Queue, QueueShuffle
from .audit import queue_change_record
from .recovery import queue_config_sync


def shuffle_commit_ensure(queue: Queue) -> QueueShuffle | None:
    """Commit to a random seed for the queue's scheduled start (its hash is published at once); a
    changed start gets a new commitment, and unrevealed ones for other starts are dropped."""
    caching.forget(caching.shuffle_key(queue.slug))
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
            drawn = span[1] - span[0] + 1 if span else 0
        else:
            entries = store.prequeue_entries(queue.slug, joined_before_ms=starts_ms)
            tickets = sorted((entry.seq, entry.priority) for entry in entries)
            order = shuffle.shuffle_order(record.seed, tickets)
            by_seq = {entry.seq: entry.ticket_id for entry in entries}
            places = [(by_seq[seq], score) for seq, score in shuffle.shuffled_places(order).items()]
            store.reorder(queue.slug, places, now_ms=clock.now_ms(now))
            record.tickets = [list(t) for t in tickets]
            record.order = order
            drawn = len(tickets)
        record.revealed_at = datetime.fromtimestamp(now, tz=UTC)
        record.save(update_fields=["tickets", "order", "numbers", "revealed_at"])
        # The start and its draw in the audit log, as an operator's change would be (issue 47).
        queue_change_record(
            queue,
            action="scheduled_start",
            before={"phase": "prequeue"},
            after={"phase": "open", "drawn": drawn, "commitment": record.commitment, "seed": record.seed},
            actor=None,
            actor_label="schedule: starts_at",
        )
        caching.forget(caching.shuffle_key(queue.slug))
    queue_config_sync(Queue.objects.prefetch_related(*Queue.MIRROR_READS).get(pk=queue.pk))
    # Everyone's place changed: the jump in the event sequence makes every page ask for its new one.
    realtime.send([realtime.snapshot(queue.slug, selectors.queue_stats_get(slug=queue.slug, now=now))])
    return record
