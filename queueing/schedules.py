"""Periodic tasks, defined here in code and written to django-celery-beat's tables after every migrate,
so they show (and can be tuned) in admin."""

from __future__ import annotations

from typing import Any

BEAT_SCHEDULES: list[dict[str, Any]] = [
    {
        "name": "Admission tick",
        "task": "queueing.tasks.admission_tick",
        "every_seconds": 1,
        # A tick that waited longer than this in the broker is stale; the next one does its work.
        "expire_seconds": 5,
    },
    {"name": "Cleanup", "task": "queueing.tasks.cleanup", "every_seconds": 5, "expire_seconds": 15},
    {
        "name": "Live snapshots",
        "task": "queueing.tasks.realtime_snapshots",
        "every_seconds": 5,
        "expire_seconds": 5,
    },
    {
        "name": "Dashboard stats snapshot",
        "task": "admin_dashboard.tasks.stats_snapshot",
        "every_seconds": 10,
        "expire_seconds": 10,
    },
    {
        "name": "Dashboard stats prune",
        "task": "admin_dashboard.tasks.stats_prune",
        "every_seconds": 3600,
        "expire_seconds": 600,
    },
    {"name": "Alerts", "task": "alerts.tasks.alerts_check", "every_seconds": 5, "expire_seconds": 10},
    # Visitors who left an e-mail address: their turn near or come (and their heartbeat while away).
    {"name": "Turn notices", "task": "queueing.tasks.turn_notices", "every_seconds": 5, "expire_seconds": 10},
    {
        "name": "Alert deliveries prune",
        "task": "alerts.tasks.alerts_prune",
        "every_seconds": 3600,
        "expire_seconds": 600,
    },
    {
        "name": "Signing key prune",
        "task": "queueing.tasks.signing_keys_prune",
        "every_seconds": 3600,
        "expire_seconds": 600,
    },
]


def beat_schedules_ensure(**_: Any) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    for spec in BEAT_SCHEDULES:
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=spec["every_seconds"], period=IntervalSchedule.SECONDS
        )
        PeriodicTask.objects.get_or_create(
            name=spec["name"],
            defaults={
                "task": spec["task"],
                "interval": interval,
                "expire_seconds": spec["expire_seconds"],
                "enabled": True,
            },
        )
