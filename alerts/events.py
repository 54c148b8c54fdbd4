"""What an alert is about, decided from what a queue looks like now and what it looked like when last seen
(pure functions, no I/O; `services` reads the figures and keeps what was seen per hook and queue).

States are announced when they change (opened, pre-queue opened, paused, closed); conditions when they
begin and when they end (waiting above the hook's threshold, admission stalled with people waiting, the
site unhealthy), so an operator's pager can open and close an incident.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from queueing import health

from .names import (
    CLOSED,
    HEALTHY,
    OPENED,
    PAUSED,
    PREQUEUE_OPENED,
    RESUMED,
    STALLED,
    UNHEALTHY,
    WAITING_ABOVE,
    WAITING_BELOW,
)

PHASE_EVENTS = {"open": OPENED, "prequeue": PREQUEUE_OPENED, "paused": PAUSED, "closed": CLOSED}

# The line must fall this far below the threshold before it counts as below again (a line hovering at the
# threshold would otherwise page on every check).
WAITING_HYSTERESIS = 0.9


@dataclass(frozen=True)
class StateChange:
    """A change of the queue's state, from its audit log: every one is told, however soon it is undone
    (a pause undone before the next look would be missed by comparing states alone), with who made it."""

    id: int
    state: str
    by: str
    at: str


@dataclass(frozen=True)
class Figures:
    """One queue as a check sees it."""

    phase: str  # open | prequeue | before_prequeue | paused | closed
    schedule: str  # before_prequeue | prequeue | running: where the clock is in the queue's schedule
    waiting: int
    waiting_here: int  # of those, not parked as away (absent when they reached the head)
    admitted_total: int
    # The site has room and the outflow in force lets someone in: only then is nobody let in a stall (a full
    # site, or an outflow of 0, is the operator's setting at work, as the Prometheus rule also judges it).
    room: bool
    site: health.SiteHealth
    thresholds: health.Thresholds
    stats: Mapping[str, Any] = field(default_factory=dict)  # the queue's live figures, sent with every alert


@dataclass(frozen=True)
class Rules:
    """What one hook asks to be told."""

    waiting_threshold: int | None
    stall_seconds: int


def _opening(schedule: str) -> str | None:
    """What a queue that is open says at this point of its schedule."""
    return {"prequeue": PREQUEUE_OPENED, "running": OPENED}.get(schedule)


def site_unhealthy(site: health.SiteHealth, thresholds: health.Thresholds) -> bool:
    """Unhealthy as the adaptive outflow judges it: over a limit, on enough responses to tell."""
    verdict, _ = health.outflow_verdict(site, thresholds)
    return verdict == health.DECREASE


Event = tuple[str, dict[str, Any]]  # the event's name and what it says besides the figures


def observe(
    seen: Mapping[str, Any], figures: Figures, rules: Rules, now: float, changes: Sequence[StateChange] = ()
) -> tuple[dict[str, Any], list[Event]]:
    """What is seen now (to keep) and the events since `seen` (empty: the first look, which announces
    no state, only conditions already true). `changes`: the queue's state changes audited since
    `seen["change_id"]`, oldest first."""
    first = not seen
    events: list[Event] = []
    if not first:
        for change in changes:
            name = _opening(figures.schedule) if change.state == "open" else PHASE_EVENTS.get(change.state)
            if name:
                events.append((name, {"by": change.by, "at": change.at}))
        if seen.get("schedule") != figures.schedule and figures.phase not in ("paused", "closed"):
            name = _opening(figures.schedule)
            if name:
                events.append((name, {"by": "schedule"}))

    above = bool(seen.get("waiting_above"))
    if rules.waiting_threshold is not None:
        if not above and figures.waiting >= rules.waiting_threshold:
            above = True
            events.append((WAITING_ABOVE, {}))
        elif above and figures.waiting < max(1, int(rules.waiting_threshold * WAITING_HYSTERESIS)):
            above = False
            events.append((WAITING_BELOW, {}))
    elif above:  # the threshold was removed: the condition is over
        above = False

    # Progress: someone was let through, or there was nobody to let through (those parked as away cannot
    # be), or the queue was not meant to let anyone through (paused, closed, before its start).
    progress_at = float(seen.get("progress_at", now))
    if (
        figures.admitted_total != seen.get("admitted_total")
        or figures.waiting_here == 0
        or figures.phase != "open"
        or not figures.room
    ):
        progress_at = now
    stalled_before = bool(seen.get("stalled"))
    stalled = now - progress_at >= rules.stall_seconds
    if stalled and not stalled_before:
        events.append((STALLED, {"stalled_seconds": round(now - progress_at)}))
    elif stalled_before and not stalled:
        events.append((RESUMED, {}))

    unhealthy_before = bool(seen.get("unhealthy"))
    unhealthy = site_unhealthy(figures.site, figures.thresholds)
    if unhealthy and not unhealthy_before:
        events.append((UNHEALTHY, {}))
    elif unhealthy_before and not unhealthy:
        events.append((HEALTHY, {}))

    last_change = max([change.id for change in changes], default=int(seen.get("change_id") or 0))
    kept = {
        "phase": figures.phase,
        "schedule": figures.schedule,
        "change_id": last_change,
        "waiting_above": above,
        "admitted_total": figures.admitted_total,
        "progress_at": progress_at,
        "stalled": stalled,
        "unhealthy": unhealthy,
        "seen_at": now,
    }
    return kept, events


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The webhook's X-WaitingRoom-Signature header: `t=<unix time>,v1=<hex HMAC-SHA256 of "t.body">`.
    The receiver recomputes it with the hook's secret and refuses old timestamps (replays)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def signature_valid(secret: str, header: str, body: bytes, *, now: float, tolerance_seconds: int = 300) -> bool:
    """What a receiver does with the header (used by the tests, and shown in README)."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_seconds:
        return False
    expected = signature(secret, timestamp, body)
    return hmac.compare_digest(expected, header)
