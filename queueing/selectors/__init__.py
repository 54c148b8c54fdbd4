"""Every read, one module per concern; never imports services. A read that finds the queue's policy
missing from Redis raises PolicyMissing, and the caller syncs it (services.with_policy; modes.py does for
the visitor paths) and reads again.

* `tickets`  a tracked ticket's status (also its heartbeat), poll advice, admission links, neighbours
* `windows`  stateless mode: a ticket's state from its number and the window; the public window
* `queues`   live figures for staff, the site's health, the mirrored policy and mode, sessions, samples
* `readiness` whether this process can serve: Redis, the database, the beat's last tick (`/readyz`)
* `metrics`  what Prometheus reads of the live state at a scrape: every queue's figures, the beat's tick
"""

from ..store import QueueSnapshot, WaitSample
from .limits import DEFAULT_LIMITS, limit_call, limit_check, limit_flow, limit_hit
from .metrics import Scrape, scrape_read
from .queues import (
    MODE_CACHE_SECONDS,
    health_window_seconds,
    outflow_in_force,
    queue_mode_forget,
    queue_mode_get,
    queue_mode_known,
    queue_policy_get,
    queue_sessions_get,
    queue_shuffle_etag,
    queue_shuffle_get,
    queue_shuffle_summary_get,
    queue_snapshot_get,
    queue_stats_get,
    site_health_get,
    wait_samples_get,
)
from .readiness import REQUIRED as READINESS_REQUIRED
from .readiness import Check, readiness
from .tickets import (
    NeighbourView,
    PolicyMissing,
    Polled,
    TicketGone,
    TicketView,
    admission_link,
    heartbeat_ceiling,
    limit_decided,
    opens_in_seconds,
    poll_after_seconds,
    polled,
    polled_flow,
    public_status,
    sighting_ceiling,
    ticket_neighbours_get,
    ticket_status_plan,
    ticket_view,
    visitor_status_get,
    with_query,
)
from .windows import (
    EXPIRED_EPOCH,
    EXPIRED_WINDOW,
    RATE_TAU_S,
    observed_per_minute,
    position_status_plan,
    position_view,
    window_admitting,
    window_next_step_seconds,
    window_place,
    window_public,
    window_public_get,
    window_public_plan,
)

__all__ = [
    "DEFAULT_LIMITS",
    "EXPIRED_EPOCH",
    "EXPIRED_WINDOW",
    "MODE_CACHE_SECONDS",
    "RATE_TAU_S",
    "READINESS_REQUIRED",
    "Check",
    "NeighbourView",
    "PolicyMissing",
    "Polled",
    "QueueSnapshot",
    "Scrape",
    "TicketGone",
    "TicketView",
    "WaitSample",
    "admission_link",
    "health_window_seconds",
    "heartbeat_ceiling",
    "limit_call",
    "limit_check",
    "limit_decided",
    "limit_flow",
    "limit_hit",
    "observed_per_minute",
    "opens_in_seconds",
    "outflow_in_force",
    "poll_after_seconds",
    "polled",
    "polled_flow",
    "position_status_plan",
    "position_view",
    "public_status",
    "queue_mode_forget",
    "queue_mode_get",
    "queue_mode_known",
    "queue_policy_get",
    "queue_sessions_get",
    "queue_shuffle_etag",
    "queue_shuffle_get",
    "queue_shuffle_summary_get",
    "queue_snapshot_get",
    "queue_stats_get",
    "readiness",
    "scrape_read",
    "sighting_ceiling",
    "site_health_get",
    "ticket_neighbours_get",
    "ticket_status_plan",
    "ticket_view",
    "visitor_status_get",
    "wait_samples_get",
    "window_admitting",
    "window_next_step_seconds",
    "window_place",
    "window_public",
    "window_public_get",
    "window_public_plan",
    "with_query",
]
