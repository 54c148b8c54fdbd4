"""The dashboard's writes: stats snapshots and wait samples (beat task), pruning, and staff controls."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from queueing import caching, realtime, selectors, services
from queueing.models import Queue

from .models import QueueSnapshot, WaitSample

DASHBOARD_GROUP = "dashboard"
MAX_PERIOD_SECONDS = 600  # a longer gap since the previous snapshot (beat was down): no period figures


def _at(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def wait_samples_store(queue: Queue) -> int:
    """Move the queue's admitted tickets' (estimated, actual) waits from Redis into the database.

    Read, store, and only then drop from Redis what was stored (after the commit): a database error
    leaves every sample in Redis for the next run, and samples stored twice (the drop failed, the task
    ran again) are kept once."""
    samples = selectors.wait_samples_get(queue.slug)
    if not samples:
        return 0
    rows = [
        WaitSample(
            queue=queue,
            ticket_id=sample.ticket_id,
            joined_at=_at(sample.joined_ms),
            admitted_at=_at(sample.admitted_ms),
            estimated_seconds=sample.estimated_s,
            actual_seconds=max(0, sample.admitted_ms - sample.joined_ms) / 1000,
            stopped=sample.stopped,
        )
        for sample in samples
    ]
    with transaction.atomic():  # a failure rolls back only this (a caller may be in a transaction)
        WaitSample.objects.bulk_create(rows, ignore_conflicts=True)  # a sample stored twice is kept once
    transaction.on_commit(lambda: services.wait_samples_drop(queue.slug, through=samples[-1], read=len(samples)))
    return len(samples)


def queue_snapshot_take(queue: Queue, *, now: float | None = None) -> QueueSnapshot:
    """Store the queue's figures now, with the admissions since its previous snapshot."""
    now = time.time() if now is None else now
    wait_samples_store(queue)
    stats = selectors.queue_stats_get(slug=queue.slug, now=now)
    totals, site = stats["totals"], stats["site_health"]
    taken_at = datetime.fromtimestamp(now, tz=UTC)
    previous = QueueSnapshot.objects.filter(queue=queue, taken_at__lt=taken_at).order_by("-taken_at").first()
    period = admissions = 0.0
    if previous is not None:
        gap = (taken_at - previous.taken_at).total_seconds()
        if 0 < gap <= MAX_PERIOD_SECONDS and totals["admitted"] >= previous.total_admitted:
            period, admissions = gap, totals["admitted"] - previous.total_admitted
    snapshot = QueueSnapshot.objects.create(
        queue=queue,
        taken_at=taken_at,
        state=stats["state"],
        waiting=stats["waiting"],
        admitted=stats["admitted"],
        active=stats["active"],
        capacity=stats["capacity"],
        capacity_in_use=stats["capacity_in_use"],
        viewers=stats["viewers"],
        total_joined=totals["joined"],
        total_admitted=totals["admitted"],
        total_completed=totals["completed"],
        total_expired=totals["expired_claim"] + totals["expired_session"] + totals["revoked"],
        total_abandoned=totals["abandoned"] + totals["left"],
        period_seconds=round(period, 3),
        admissions=int(admissions),
        outflow_configured=stats["outflow_per_minute_configured"],
        outflow_observed=round(admissions / period * 60, 3) if period else stats["outflow_per_minute_observed"],
        average_wait_seconds=stats["average_wait_seconds"],
        average_service_seconds=stats["average_service_seconds"],
        outflow_effective=stats["outflow_per_minute_effective"],
        health_requests=site["requests"],
        health_error_rate=site["error_rate"],
        health_p95_ms=site["p95_latency_ms"],
    )
    caching.series_changed(queue.pk)
    return snapshot


def stats_snapshots_take(*, now: float | None = None) -> int:
    """A snapshot of every queue that is not closed; tells open dashboards about the new points."""
    from .selectors import snapshot_point

    taken = []
    for queue in Queue.objects.exclude(state=Queue.State.CLOSED):
        taken.append(queue_snapshot_take(queue, now=now))
    realtime.send(
        (DASHBOARD_GROUP, {"type": "snapshot", "slug": s.queue.slug, "point": snapshot_point(s)}) for s in taken
    )
    return len(taken)


def stats_prune(*, now: float | None = None) -> tuple[int, int]:
    """Drop snapshots and wait samples older than WR_DASHBOARD_RETENTION_HOURS."""
    now = time.time() if now is None else now
    cutoff = datetime.fromtimestamp(now, tz=UTC) - timedelta(hours=settings.WR_DASHBOARD_RETENTION_HOURS)
    old = QueueSnapshot.objects.filter(taken_at__lt=cutoff)
    for queue_pk in set(old.values_list("queue_id", flat=True)):
        caching.series_changed(queue_pk)
    snapshots, _ = old.delete()
    samples, _ = WaitSample.objects.filter(admitted_at__lt=cutoff).delete()
    return snapshots, samples


# --- Controls (staff with the queue change permission) ----------------------------------------------


def _changed(queue: Queue, actor: Any) -> None:
    """Tell open dashboards at once (they refresh every few seconds anyway)."""
    realtime.send([(DASHBOARD_GROUP, {"type": "changed", "slug": queue.slug, "by": actor.get_username()})])


def queue_control(queue: Queue, *, action: str, actor: Any, changes: dict[str, Any] | None = None) -> Queue:
    """Pause, resume or change capacity/outflow; audited, effective on the next tick."""
    if action == "pause":
        queue = services.queue_pause(queue, actor=actor)
    elif action == "resume":
        queue = services.queue_resume(queue, actor=actor)
    elif action == "update":
        queue = services.queue_update(queue, changes=changes or {}, actor=actor)
    else:
        raise ValueError(action)
    _changed(queue, actor)
    return queue


def session_revoke(queue: Queue, *, ticket_id: str, actor: Any) -> str:
    """Throw a visitor out from the dashboard (audited); the slot it held goes to the next at once."""
    with transaction.atomic():
        result = services.session_revoke(slug=queue.slug, ticket_id=ticket_id)
        if result == "revoked":
            services.queue_change_record(
                queue,
                action="revoke",
                before={"ticket_id": ticket_id},
                after={"ticket_id": ticket_id, "status": "revoked"},
                actor=actor,
            )
    _changed(queue, actor)
    return result
