"""The events an alert can be about (their names are the webhook's `event` and X-WaitingRoom-Event)."""

from __future__ import annotations

OPENED = "queue.opened"
PREQUEUE_OPENED = "queue.prequeue_opened"
PAUSED = "queue.paused"
CLOSED = "queue.closed"
WAITING_ABOVE = "queue.waiting_above_threshold"
WAITING_BELOW = "queue.waiting_below_threshold"
STALLED = "admission.stalled"
RESUMED = "admission.resumed"
UNHEALTHY = "site.unhealthy"
HEALTHY = "site.healthy"
TEST = "test"

EVENTS: dict[str, str] = {
    OPENED: "The queue opened: visitors are let through",
    PREQUEUE_OPENED: "The pre-queue opened: visitors join and wait for the draw at the start",
    PAUSED: "The queue was paused: it takes joins and lets nobody through",
    CLOSED: "The queue closed: it takes no joins",
    WAITING_ABOVE: "The line grew past the hook's threshold",
    WAITING_BELOW: "The line fell back below the hook's threshold",
    STALLED: "Nobody was let through for a while although people wait",
    RESUMED: "Visitors are let through again after a stall",
    UNHEALTHY: "The protected site's response time or error rate is over its limit",
    HEALTHY: "The protected site is back within its limits",
}
