"""What the periodic tasks keep tidy: overdue admissions, sessions and absent visitors expired in bounded
rounds, the Redis state of deleted queues, and the watchers' periodic snapshots."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.conf import settings

from .. import clock, logcontext, realtime, selectors, store
from ..models import FinishedTicket, Queue
from .admission import queue_admit

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
            now_ms=clock.now_ms(now),
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
    for pk, slug, mode in Queue.objects.values_list("pk", "slug", "mode"):
        with logcontext.about(queue=slug):
            reply = queue_cleanup(slug=slug, now=now)
            total += len(reply.expired_slots) + len(reply.abandoned)
            if mode == Queue.Mode.TRACKED:
                finished_tickets_note(queue_pk=pk, slug=slug, now=now)
    return total


FINISHED_KEEP_SECONDS = 24 * 3600
FINISHED_ROUNDS = 20  # batches of WR_CLEANUP_CHUNK per run


def finished_tickets_note(*, queue_pk: int, slug: str, now: float | None = None) -> int:
    """Note in the database the tickets finished since the last run (left, expired, completed, revoked),
    so that lost state does not give them back a place or a session (recovery.py passes them to the new
    epoch); notes older than a day are dropped. Returns how many were noted."""
    now = time.time() if now is None else now
    noted = 0
    for _ in range(FINISHED_ROUNDS):
        _, seqs = store.finished_journal(slug, limit=settings.WR_CLEANUP_CHUNK)
        FinishedTicket.objects.bulk_create(
            [FinishedTicket(queue_id=queue_pk, seq=seq) for seq in seqs], ignore_conflicts=True
        )
        noted += len(seqs)
        if len(seqs) < settings.WR_CLEANUP_CHUNK:
            break
    cutoff = datetime.fromtimestamp(now - FINISHED_KEEP_SECONDS, tz=UTC)
    FinishedTicket.objects.filter(queue_id=queue_pk, noted_at__lt=cutoff).delete()
    return noted


def wait_samples_drop(slug: str, *, through: store.WaitSample, read: int) -> int:
    """Drop the wait samples up to and including `through`, once they are stored elsewhere (the dashboard)."""
    return store.wait_samples_drop(slug, through=through, read=read)
