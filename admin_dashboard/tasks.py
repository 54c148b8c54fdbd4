"""Thin, idempotent tasks: a snapshot taken twice is two points; samples are stored once each."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(ignore_result=True)
def stats_snapshot() -> int:
    return services.stats_snapshots_take()


@shared_task(ignore_result=True)
def stats_prune() -> tuple[int, int]:
    return services.stats_prune()
