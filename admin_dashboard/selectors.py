"""What the dashboard reads: live figures from Redis, series and wait-estimate truth from the database."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from queueing import caching, selectors
from queueing.models import Queue, QueueChange
from queueing.phases import PHASE_WORDS

from .models import QueueSnapshot, WaitSample

SERIES_HOURS_DEFAULT = 1
SERIES_POINTS_MAX = 2000


def queue_live(queue: Queue, *, now: float | None = None) -> dict[str, Any]:
    """A queue's live card: the staff stats with its name, and the site's health flat for the page."""
    stats = selectors.queue_stats_get(slug=queue.slug, now=now)
    site = stats["site_health"]
    rate = site["error_rate"]
    return {
        "name": queue.name,
        **stats,
        "phase_words": PHASE_WORDS.get(stats.get("phase", ""), stats.get("state", "")),
        "health_p95_ms": round(site["p95_latency_ms"]) if site["p95_latency_ms"] is not None else None,
        "health_error_percent": round(rate * 100, 2) if rate is not None else None,
        "health_requests": site["requests"],
        "health_window_seconds": site["window_seconds"],
    }


def schedule_phase(queue: Queue, *, now: datetime | None = None) -> str:
    """Where a scheduled queue is in its schedule, in words ('' when it has none)."""
    now = now or timezone.now()
    if not (queue.prequeue_opens_at or queue.starts_at or queue.ends_at):
        return ""
    if queue.ends_at and now >= queue.ends_at:
        return "ended: the queue is closed"
    if queue.prequeue_opens_at and now < queue.prequeue_opens_at:
        return "before the pre-queue: joins are refused until it opens"
    if queue.starts_at and now < queue.starts_at:
        return "pre-queue: joiners wait for the draw at the start"
    return "running"


def dashboard_cards(*, now: float | None = None) -> list[dict[str, Any]]:
    return [queue_live(queue, now=now) for queue in Queue.objects.order_by("slug")]


def snapshot_point(snapshot: QueueSnapshot) -> dict[str, Any]:
    """One point of the charts (and one row of the CSV export)."""
    return {
        "t": round(snapshot.taken_at.timestamp(), 3),
        "state": snapshot.state,
        "waiting": snapshot.waiting,
        "admitted": snapshot.admitted,
        "active": snapshot.active,
        "capacity": snapshot.capacity,
        "capacity_in_use": snapshot.capacity_in_use,
        "capacity_use": snapshot.capacity_use,
        "viewers": snapshot.viewers,
        "admissions": snapshot.admissions,
        "period_seconds": snapshot.period_seconds,
        "outflow_configured": snapshot.outflow_configured,
        "outflow_observed": snapshot.outflow_observed,
        "outflow_effective": snapshot.outflow_effective,
        "health_requests": snapshot.health_requests,
        "health_error_rate": snapshot.health_error_rate,
        "health_p95_ms": snapshot.health_p95_ms,
        "average_wait_seconds": snapshot.average_wait_seconds,
        "average_service_seconds": snapshot.average_service_seconds,
        "total_joined": snapshot.total_joined,
        "total_admitted": snapshot.total_admitted,
        "total_completed": snapshot.total_completed,
        "total_expired": snapshot.total_expired,
        "total_abandoned": snapshot.total_abandoned,
    }


def since(hours: float, *, now: float | None = None) -> datetime:
    return datetime.fromtimestamp(time.time() if now is None else now, tz=UTC) - timedelta(hours=hours)


def queue_snapshots(queue: Queue, *, start: datetime | None = None) -> QuerySet[QueueSnapshot]:
    snapshots = QueueSnapshot.objects.filter(queue=queue).order_by("taken_at")
    return snapshots.filter(taken_at__gte=start) if start is not None else snapshots


def queue_series(queue: Queue, *, start: datetime) -> list[dict[str, Any]]:
    """The chart points since `start` (at most the latest SERIES_POINTS_MAX).

    Kept in the cache until the queue's next snapshot (or prune) changes them: every open dashboard of
    a queue asks for the same points. A cached series starts at the minute before `start` and is cut to
    it here, so requests a few seconds apart share one."""
    version = caching.series_version(queue.pk)
    if version is None:
        return _series(queue, start=start)
    minute = datetime.fromtimestamp(start.timestamp() // 60 * 60, tz=UTC)
    key = f"dashboard:series:{queue.pk}:{version}:{int(minute.timestamp())}"
    points = caching.remembered(key, lambda: _series(queue, start=minute), caching.SERIES_SECONDS)
    since = start.timestamp()
    return [point for point in points if point["t"] >= since][-SERIES_POINTS_MAX:]


def _series(queue: Queue, *, start: datetime) -> list[dict[str, Any]]:
    newest_first = QueueSnapshot.objects.filter(queue=queue, taken_at__gte=start).order_by("-taken_at")
    latest = list(newest_first[:SERIES_POINTS_MAX])
    return [snapshot_point(s) for s in reversed(latest)]


def _percentile(ordered: list[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted values."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)]


SCATTER_POINTS = 400  # the estimate-vs-actual chart's points at most (the latest, evenly thinned)
COUNTED_WAIT_SECONDS = 10  # relative errors only for waits this long (a 2 s wait told 1 s is not 50 % off)


def estimate_truth(queue: Queue, *, start: datetime) -> dict[str, Any]:
    """How far the wait told at join was from the wait had, over tickets admitted since `start`.

    Error = actual - estimated (positive: waited longer than told). Tickets that joined with no estimate
    (paused, closed) count in `samples` but not in the error figures, nor do waits admission stopped
    during (`stopped`: a pause or a close after the join, which no estimate could foresee). The relative
    error |told - had| / had is over waits of COUNTED_WAIT_SECONDS or more (what bench/estimate_sim.py
    measures); `points` are [told, had] pairs for the scatter chart.
    """
    rows = (
        WaitSample.objects.filter(queue=queue, admitted_at__gte=start)
        .order_by("admitted_at")
        .values_list("estimated_seconds", "actual_seconds", "stopped")
    )
    samples = stopped_count = 0
    errors: list[float] = []
    relative: list[float] = []
    points: list[list[float]] = []
    for estimated, actual, stopped in rows:
        samples += 1
        stopped_count += stopped
        if estimated is not None and not stopped:
            errors.append(actual - estimated)
            points.append([estimated, round(actual, 1)])
            if actual >= COUNTED_WAIT_SECONDS:
                relative.append(abs(estimated - actual) / actual)
    absolute = sorted(abs(e) for e in errors)
    p50, p90 = _percentile(absolute, 50), _percentile(absolute, 90)
    relative.sort()
    r50, r90 = _percentile(relative, 50), _percentile(relative, 90)
    step = max(1, math.ceil(len(points) / SCATTER_POINTS))
    return {
        "samples": samples,
        "with_estimate": len(errors),
        "stopped": stopped_count,
        "p50_abs_error_seconds": round(p50, 1) if p50 is not None else None,
        "p90_abs_error_seconds": round(p90, 1) if p90 is not None else None,
        "mean_error_seconds": round(sum(errors) / len(errors), 1) if errors else None,
        "p50_error_percent": round(r50 * 100) if r50 is not None else None,
        "p90_error_percent": round(r90 * 100) if r90 is not None else None,
        "points": points[::-1][::step][::-1],
    }


def queue_sessions(queue: Queue, *, limit: int = 50) -> list[dict[str, Any]]:
    """Admitted and active tickets (the ones staff may revoke), soonest to expire first."""
    return [
        {"ticket_id": ticket_id, "status": status, "until": datetime.fromtimestamp(until_ms / 1000, tz=UTC)}
        for ticket_id, status, until_ms in selectors.queue_sessions_get(queue.slug, limit=limit)
    ]


def queue_changes(queue: Queue, *, limit: int | None = 50) -> QuerySet[QueueChange]:
    changes = QueueChange.objects.filter(queue=queue).select_related("actor").order_by("-created_at", "-id")
    return changes[:limit] if limit is not None else changes
