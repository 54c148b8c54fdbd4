"""Stateless mode (SPEC 4): a ticket's state follows from its number and the queue's window; the window as
anyone may see it."""

from __future__ import annotations

import math
import random
import time
from typing import Any

from django.conf import settings

from .. import clock, ratelimit, shuffle, store, tokens
from .tickets import PolicyMissing, Polled, TicketView, limit_decided, polled, with_query

RATE_TAU_S = 30  # as in lua/_lib.lua


def observed_per_minute(ema_rate: float, ema_ts_ms: int, now: float | None = None) -> float:
    """Admissions per minute actually seen recently: the EMA kept by the scripts, decayed to now."""
    if ema_ts_ms <= 0:
        return 0.0
    age_s = max(0.0, (time.time() if now is None else now) - ema_ts_ms / 1000)
    return ema_rate * math.exp(-age_s / RATE_TAU_S) * 60


EXPIRED_WINDOW = "expired_window"  # why a stateless ticket expired: the window passed it
# ... or it is of a sale this window does not continue: an epoch before a change of mode, or a queue of the
# same slug deleted since (issue 50: such numbers came back as the first places of the new sale)
EXPIRED_EPOCH = "expired_epoch"


def ticket_void(claims: tokens.PositionClaims, window: store.Window) -> bool:
    """Whether the ticket is of another sale than the window's (EXPIRED_EPOCH)."""
    return window.ticket_void or bool(claims.queue_id and window.queue_id and claims.queue_id != window.queue_id)


def window_place(window: store.Window, number: int) -> int:
    """A ticket's place: its number (moved by the pre-queue shuffle if it joined the pre-queue) less the
    numbers its epoch skipped."""
    if window.prequeue is not None and window.prequeue[0] <= number <= window.prequeue[1]:
        number = shuffle.place(window.seed, window.prequeue[0], window.prequeue[1], number)
    return number - window.ticket_gap


def window_admitting(window: store.Window, now_ms: int) -> bool:
    """Whether the window may move now (the queue admits): open, started, shuffled, not ended."""
    return (
        window.state == "open"
        and now_ms >= window.starts_ms
        and not window.shuffle_pending
        and (window.ends_ms == 0 or now_ms < window.ends_ms)
    )


def window_next_step_seconds(window: store.Window, now_ms: int) -> float | None:
    """Seconds until the window moves next (None: it is not moving: paused, closed, before the start)."""
    if not window_admitting(window, now_ms):
        return None
    return max(0.0, (window.at_ms + window.interval_ms - now_ms) / 1000)


def position_view(
    slug: str, claims: tokens.PositionClaims, window: store.Window, *, now_ms: int | None = None
) -> TicketView:
    """A stateless ticket's state from its own number and the window (no per-visitor state): waiting
    above the window, active within its last `active_windows` steps (an access token is issued now, as
    the ticket asks), expired below."""
    now_ms = clock.now_ms() if now_ms is None else now_ms
    place = window_place(window, claims.number)
    started = now_ms >= window.starts_ms and not window.shuffle_pending
    interval = window.interval_ms / 1000
    access_token = redirect_url = None
    expires_at = None
    position = ahead = estimate = None
    reason = ""
    if ticket_void(claims, window):
        status, reason, poll = "expired", EXPIRED_EPOCH, 60.0
    elif not started or place > window.active:
        status = "waiting"
        position = max(1, place - window.active)
        ahead = position - 1
        steps = math.ceil(position / window.size)
        if window.state == "open":
            until_start = max(0.0, (window.starts_ms - now_ms) / 1000)
            due = window_next_step_seconds(window, now_ms)
            estimate = math.ceil(until_start + (steps - 1) * interval + (interval if due is None else due))
        poll = min(60.0, max(interval, (estimate or 0) / 5, 2.0))
    elif place > window.active - window.windows * window.size:
        status = "admitted"
        expires_ms = now_ms + window.session_ttl * 1000
        access_token = tokens.access_token_issue(
            slug=slug,
            ticket_id=claims.ticket_id,
            fence=0,
            expires_ms=expires_ms,
            epoch=claims.epoch,
            stateless=True,
            queue_id=window.queue_id,
        )
        redirect_url = with_query(window.target_url, **{settings.WR_ACCESS_QUERY_PARAM: access_token})
        expires_at = expires_ms // 1000
        poll = 60.0
    else:
        status, reason, poll = "expired", EXPIRED_WINDOW, 60.0
    figures_state = "closed" if window.ends_ms and now_ms >= window.ends_ms else window.state
    return TicketView(
        ticket_id=claims.ticket_id,
        status=status,
        position=position,
        ahead=ahead,
        queue_length=max(0, window.issued - window.active),
        estimated_wait_seconds=estimate,
        poll_after_seconds=round(poll * random.uniform(0.8, 1.2), 1),
        access_token=access_token,
        redirect_url=redirect_url,
        expires_at=expires_at,
        reason=reason,
        epoch=window.epoch,
        seq=claims.number,
        priority=0,
        queue_state=figures_state,
        opens_in_seconds=math.ceil((window.starts_ms - now_ms) / 1000) if window.starts_ms > now_ms else None,
        event_seq=window.evseq,
        place=place,
        window=window_public(window, now_ms=now_ms),
    )


def position_status_plan(
    *, claims: tokens.PositionClaims, now: float | None = None, limit_scope: str = ""
) -> store.Plan[Polled[TicketView]]:
    """A stateless ticket's status: one Redis read (with the ticket's rate limiter in the same script when
    `limit_scope` is given; ratelimit.Limited when it refuses). PolicyMissing without a live window."""
    slug = claims.slug
    call = ratelimit.prepare(limit_scope, claims.ticket_id, now=now, queue=slug) if limit_scope else None

    def read(replies: tuple[store.Window, store.LimitReply | None]) -> Polled[TicketView]:
        window, limited = replies
        limit_decided(limited)
        if not window.live:
            raise PolicyMissing(slug)
        return Polled(position_view(slug, claims, window, now_ms=clock.now_ms(now)))

    return store.window_read_plan(slug, ticket_epoch=claims.epoch, limit=call).then(read)


def window_public(window: store.Window, *, now_ms: int) -> dict[str, Any]:
    """What anyone may know of a stateless queue's window: enough for a client holding its place to tell
    its own state without asking (the window endpoint, the `window` event)."""
    due = window_next_step_seconds(window, now_ms)
    return {
        "mode": "stateless",
        "state": "closed" if window.ends_ms and now_ms >= window.ends_ms else window.state,
        "epoch": window.epoch,
        "active_from": max(1, window.active - window.windows * window.size + 1),
        "active_to": window.active,
        "issued": window.issued,
        "queue_length": max(0, window.issued - window.active),
        "window_size": window.size,
        "window_interval": window.interval_ms / 1000,
        "active_windows": window.windows,
        "moved_at": window.at_ms / 1000,
        "next_step_in": None if due is None else round(due, 3),
        "opens_in_seconds": math.ceil((window.starts_ms - now_ms) / 1000) if window.starts_ms > now_ms else None,
        "admitted_per_minute": round(observed_per_minute(window.ema_rate, window.ema_ts_ms, now_ms / 1000), 3),
        "event_seq": window.evseq,
    }


def window_public_plan(*, slug: str, now: float | None = None) -> store.Plan[Polled[dict[str, Any]]]:
    """The window endpoint's answer (one read; no ticket, no per-visitor state). PolicyMissing without a
    live window (a tracked or unknown queue, or lost state)."""

    def read(replies: tuple[store.Window, store.LimitReply | None]) -> Polled[dict[str, Any]]:
        window = replies[0]
        if not window.live:
            raise PolicyMissing(slug)
        return Polled(window_public(window, now_ms=clock.now_ms(now)))

    return store.window_read_plan(slug).then(read)


def window_public_get(*, slug: str, now: float | None = None) -> dict[str, Any]:
    """window_public_plan, run."""
    return polled(window_public_plan(slug=slug, now=now))
