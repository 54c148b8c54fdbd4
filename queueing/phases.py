"""Where a queue is in its sale, one word for every place that says it (issue 47): the dashboard's badge,
admin's list, the metrics' `phase` label, the alerts and the webhooks.

    before_prequeue   scheduled; joins are refused until the pre-queue opens
    prequeue          joiners wait for the draw at the start; nobody is let in
    open              running: the line moves
    paused, closed    as the operator (or the end of the schedule) set it

Pure: from the operator's state and the schedule's moments (seconds since the epoch, or None)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

PHASES = ("before_prequeue", "prequeue", "open", "paused", "closed")
# As people read them (the badge, admin's list).
PHASE_WORDS = {
    "before_prequeue": "not yet open",
    "prequeue": "pre-queue",
    "open": "open",
    "paused": "paused",
    "closed": "closed",
}


def schedule_of(*, now: float, prequeue_opens_at: float | None, starts_at: float | None) -> str:
    """Where the schedule is: before_prequeue, prequeue or running (a queue without one is running)."""
    if prequeue_opens_at is not None and now < prequeue_opens_at:
        return "before_prequeue"
    if starts_at is not None and now < starts_at:
        return "prequeue"
    return "running"


def schedule_at(*, now: float, prequeue_opens_at: datetime | None, starts_at: datetime | None) -> str:
    """schedule_of for a queue's own moments (the database's)."""
    return schedule_of(
        now=now,
        prequeue_opens_at=prequeue_opens_at.timestamp() if prequeue_opens_at else None,
        starts_at=starts_at.timestamp() if starts_at else None,
    )


def phase_of(*, state: str, schedule: str) -> str:
    if state in ("paused", "closed"):
        return state
    return "open" if schedule == "running" else schedule


def phase_from_policy(policy: Mapping[str, str], *, now: float) -> str:
    """The phase from a queue's policy as Redis mirrors it (state, and the schedule in ms; 0 or '' none)."""

    def moment(name: str) -> float | None:
        value = float(policy.get(name) or 0)
        return value / 1000 if value > 0 else None

    schedule = schedule_of(now=now, prequeue_opens_at=moment("prequeue_opens_at_ms"), starts_at=moment("starts_at_ms"))
    return phase_of(state=str(policy.get("state", "")), schedule=schedule)
