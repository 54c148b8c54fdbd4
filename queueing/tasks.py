"""Thin, idempotent Celery tasks: each calls one service. A tick that runs twice, late or concurrently
does no harm: the leader lease and the time-based token bucket bound admission whatever runs."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from . import services, signing_keys


@shared_task(bind=True, ignore_result=True)
def admission_tick(self: Task[Any, Any]) -> int:
    # Leadership belongs to the worker node (all its pool processes share it), not to one process,
    # so ticks handed to any process of the leading node admit.
    name = self.request.hostname or services.instance_id()
    admitted = services.queues_tick(instance=name)
    # Only a tick that finished counts as a sign of life (waitingroom_site/liveness.py reads it).
    services.worker_alive_mark(name)
    return admitted


@shared_task(ignore_result=True)
def cleanup() -> int:
    return services.queues_cleanup()


@shared_task(ignore_result=True)
def signing_keys_prune() -> int:
    return signing_keys.signing_keys_prune()


@shared_task(ignore_result=True)
def realtime_snapshots() -> int:
    return services.queues_snapshot_broadcast()


@shared_task(ignore_result=True)
def turn_notices() -> int:
    return services.turn_notices_send()
