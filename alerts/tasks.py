"""Thin Celery tasks for the alerts: the periodic check, and one attempt of one delivery."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(ignore_result=True)
def alerts_check() -> int:
    """Look at the queues, then hand every due delivery (new, or a retry whose time came) to a worker."""
    made = services.alerts_check()
    for delivery_id in services.deliveries_due():
        alert_deliver.delay(delivery_id)
    return len(made)


@shared_task(ignore_result=True)
def alert_deliver(delivery_id: str) -> bool:
    return services.delivery_attempt(delivery_id) is not None


@shared_task(ignore_result=True)
def alerts_prune() -> int:
    return services.deliveries_prune()
