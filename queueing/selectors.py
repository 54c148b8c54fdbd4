"""Every read: a ticket's status (also its heartbeat), queue stats, the advice a poller gets.

Never imports services: a read that finds the queue's policy missing from Redis raises PolicyMissing,
and the caller syncs it (services.with_policy; modes.py does for the visitor paths) and reads again."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from django.conf import settings

from . import health, ratelimit, realtime, shuffle, store, tokens
from .models import Queue
from .store import QueueFigures, TicketReply, TicketState, TicketStatus
from .store import QueueSnapshot as QueueSnapshot

RATE_TAU_S = 30  # as in lua/_lib.lua


class TicketGone(Exception):
    """The ticket is signed but its queue no longer knows it."""


class PolicyMissing(Exception):
    """Redis has no policy (or no live window) for the queue: a new queue, or lost state. Sync, read again."""


@dataclass(frozen=True)
class TicketView:
    """What the API and pages show a visitor about its ticket."""

    ticket_id: str
    status: str
    position: int | None
    ahead: int | None
    queue_length: int
    estimated_wait_seconds: int | None
    poll_after_seconds: float
    access_token: str | None
    redirect_url: str | None
    expires_at: int | None
    reason: str
    epoch: int
    seq: int
    priority: int
    queue_state: str  # open | paused | closed
    opens_in_seconds: int | None  # before a scheduled start: the pre-queue countdown
    event_seq: int  # the queue's event sequence when this was read (live push continues from it)
    # The longest a visitor may go unseen without being counted absent or missing its admission.
    heartbeat_ceiling_seconds: float = 20.0
    placement: float | None = None  # its line score (joins only), signed into the ticket
    place: int | None = None  # stateless mode: the ticket's place (its number, shuffled, less its epoch's gap)
    window: dict[str, Any] | None = None  # stateless mode: the window as window_public() shows it

    @property
    def is_waiting(self) -> bool:
        return self.status == TicketStatus.WAITING.label

    @property
    def is_finished(self) -> bool:
        return self.status in ("completed", "expired")

    def payload(self, *, ahead: bool = True) -> dict[str, Any]:
        """The ticket as the API and the websocket describe it to its visitor."""
        body: dict[str, Any] = {"ticket_id": self.ticket_id, "status": self.status, "position": self.position}
        if ahead:
            body["ahead"] = self.ahead
        body.update(
            queue_length=self.queue_length,
            estimated_wait_seconds=self.estimated_wait_seconds,
            poll_after_seconds=self.poll_after_seconds,
            queue_state=self.queue_state,
            event_seq=self.event_seq,
            epoch=self.epoch,  # event sequences start again in a new epoch (after lost state)
        )
        if self.opens_in_seconds is not None:
            body["opens_in_seconds"] = self.opens_in_seconds
        if self.access_token:
            body.update(access_token=self.access_token, redirect_url=self.redirect_url, expires_at=self.expires_at)
        if self.reason:
            body["reason"] = self.reason  # why a finished ticket finished
        if self.window is not None:
            body.update(mode="stateless", number=self.seq, place=self.place, window=self.window)
        return body


def heartbeat_ceiling(figures: QueueFigures) -> float:
    """The longest gap between two sightings of a visitor that keeps it present and its admission
    noticed: a third of the presence timeout, half the claim TTL, never under 2 s."""
    return max(2.0, min(figures.presence_timeout_s / 3, figures.claim_ttl_s / 2))


def poll_after_seconds(ticket: TicketState, figures: QueueFigures, rng: random.Random | None = None) -> float:
    """How long a client should wait before polling again (seed 004: spread the herd).

    Near the front (or when the wait is short) every 2 s, so a visitor is sent through quickly; far back
    about a tenth of the estimated wait, at most 30 s; never so rarely that an honest poller would be
    counted absent, or would miss its admission (half the claim TTL). A ±20% jitter keeps clients that
    joined together from polling together (the jitter may take a poll a little past the ceiling; the
    presence and claim windows are three and two polls long).
    """
    if ticket.status != TicketStatus.WAITING:
        return 5.0 if ticket.status.holds_slot else 60.0
    # Never so rarely that an admission could expire unseen between two polls.
    ceiling = heartbeat_ceiling(figures)
    est, rank = ticket.est_wait_s, ticket.rank or 0
    if est is None:
        base = 10.0
    elif est <= 10 or rank < max(2 * figures.free, 5):
        base = 2.0
    else:
        base = min(30.0, max(2.0, est / 10))
    return round(min(base, ceiling) * (rng or random).uniform(0.8, 1.2), 1)


def public_status(status: TicketStatus) -> str:
    """The statuses the API speaks of (SPEC 6.1): a revoked ticket is simply expired (reason: revoked)."""
    return "expired" if status == TicketStatus.REVOKED else status.label


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = (parts.query + "&" if parts.query else "") + urlencode(params)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def admission_link(
    slug: str, *, ticket_id: str, fence: int, expires_ms: int, target_url: str, epoch: int
) -> tuple[str, str]:
    """(access token, redirect URL) for an admitted ticket: where the visitor goes, carrying its token."""
    access_token = tokens.access_token_issue(
        slug=slug, ticket_id=ticket_id, fence=fence, expires_ms=expires_ms, epoch=epoch
    )
    return access_token, _with_query(target_url, **{settings.WR_ACCESS_QUERY_PARAM: access_token})


def opens_in_seconds(figures: QueueFigures, now_ms: int) -> int | None:
    if figures.starts_at_ms <= now_ms:
        return None
    return math.ceil((figures.starts_at_ms - now_ms) / 1000)


def ticket_view(slug: str, reply: TicketReply, *, now_ms: int | None = None) -> TicketView:
    ticket, figures = reply.ticket, reply.figures
    if ticket is None or figures is None:
        raise TicketGone(slug)
    access_token = redirect_url = None
    expires_at = None
    if ticket.status.holds_slot:
        access_token, redirect_url = admission_link(
            slug,
            ticket_id=ticket.ticket_id,
            fence=ticket.fence,
            expires_ms=ticket.expires_ms,
            target_url=figures.target_url,
            epoch=figures.epoch,
        )
        expires_at = ticket.expires_ms // 1000
    waiting = ticket.status == TicketStatus.WAITING and ticket.rank is not None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return TicketView(
        ticket_id=ticket.ticket_id,
        status=public_status(ticket.status),
        position=(ticket.rank or 0) + 1 if waiting else None,
        ahead=ticket.rank if waiting else None,
        queue_length=figures.waiting,
        estimated_wait_seconds=ticket.est_wait_s if waiting else None,
        poll_after_seconds=poll_after_seconds(ticket, figures),
        access_token=access_token,
        redirect_url=redirect_url,
        expires_at=expires_at,
        reason=ticket.reason,
        epoch=figures.epoch,
        seq=ticket.seq,
        priority=ticket.priority,
        queue_state=figures.state,
        opens_in_seconds=opens_in_seconds(figures, now_ms) if waiting else None,
        event_seq=max(figures.evseq, reply.moves.seq),
        heartbeat_ceiling_seconds=heartbeat_ceiling(figures),
        placement=ticket.score,
    )


def ticket_status_get(*, claims: tokens.TicketClaims, now: float | None = None, limit_scope: str = "") -> TicketView:
    """A ticket's state; the poll also counts as the visitor's heartbeat. One Redis round trip (with
    the ticket's rate limiter in it when `limit_scope` is given).

    TicketGone when the queue does not know the ticket (finished long ago, or replaced by the visitor's
    newer ticket); the API reports that as `expired`.
    """
    restore = store.Restore(claims.epoch, claims.priority, claims.placement, claims.issued_at * 1000)
    return visitor_status_get(
        slug=claims.slug,
        visitor_key=claims.visitor_key,
        seq=claims.seq,
        now=now,
        limit_scope=limit_scope,
        restore=restore,
    )


def visitor_status_get(
    *,
    slug: str,
    visitor_key: str,
    seq: int = 0,
    now: float | None = None,
    limit_scope: str = "",
    restore: store.Restore = store.NO_RESTORE,
) -> TicketView:
    """As ticket_status_get; seq 0 means whatever ticket the visitor has (the no-JavaScript page).

    With `limit_scope`, the visitor's rate limiter in that scope runs in the same Redis round trip;
    ratelimit.Limited when it refuses."""
    now_ms = int((time.time() if now is None else now) * 1000)
    call = ratelimit.prepare(limit_scope, visitor_key, now=now) if limit_scope else None
    if call is None:
        reply = store.status(slug, visitor_key=visitor_key, seq=seq, now_ms=now_ms, restore=restore)
    else:
        reply, limited = store.status_limited(
            slug, visitor_key=visitor_key, seq=seq, now_ms=now_ms, limit=call, restore=restore
        )
        decision = ratelimit.decision_from(limited)
        if not decision.allowed:
            raise ratelimit.Limited(decision)
    if reply.outcome == "no_config":
        raise PolicyMissing(slug)  # rare: Redis lost the policy
    if reply.moves.seq:
        # A parked visitor came back to its place: the only way a poll moves anyone.
        realtime.send(realtime.queue_move(slug, reply.moves))
    if reply.outcome != "ok":
        raise TicketGone(slug)
    return ticket_view(slug, reply, now_ms=now_ms)


@dataclass(frozen=True)
class NeighbourView:
    position: int
    display_name: str
    is_me: bool


def ticket_neighbours_get(*, claims: tokens.TicketClaims, before: int = 3, after: int = 3) -> list[NeighbourView]:
    """The few visitors around this one in line (seed 004's visual line), in one round trip."""
    _, rows = store.neighbours(claims.slug, visitor_key=claims.visitor_key, seq=claims.seq, before=before, after=after)
    return [NeighbourView(row.rank + 1, row.display_name, row.is_me) for row in rows]


def observed_per_minute(ema_rate: float, ema_ts_ms: int, now: float | None = None) -> float:
    """Admissions per minute actually seen recently: the EMA kept by the scripts, decayed to now."""
    if ema_ts_ms <= 0:
        return 0.0
    age_s = max(0.0, (time.time() if now is None else now) - ema_ts_ms / 1000)
    return ema_rate * math.exp(-age_s / RATE_TAU_S) * 60


def outflow_in_force(config: dict[str, str], stats: dict[str, str]) -> float:
    """The outflow admission follows now: the adapted one while adaptive outflow is on and has adapted,
    else the configured one (as lua/_lib.lua policy() reads it)."""
    configured = float(config.get("outflow_per_minute", 0) or 0)
    if config.get("adaptive_outflow") == "1" and stats.get("outflow_effective"):
        return float(stats["outflow_effective"])
    return configured


def health_window_seconds(config: dict[str, str]) -> int:
    """The site's health is judged, and shown, over the queue's adjustment interval."""
    return int(config.get("adaptive_interval_seconds") or 10)


def site_health_get(*, slug: str, now: float | None = None, window_seconds: int | None = None) -> health.SiteHealth:
    """The protected site's reported responses over the queue's adjustment interval (or `window_seconds`)."""
    if window_seconds is None:
        window_seconds = health_window_seconds(store.config_read(slug))
    now_ms = int((time.time() if now is None else now) * 1000)
    counts = store.health_window(slug, now_ms=now_ms, seconds=window_seconds)
    return health.SiteHealth.from_counts(
        window_seconds=counts.window_seconds, requests=counts.requests, errors=counts.errors, buckets=counts.buckets
    )


def queue_stats_get(*, slug: str, now: float | None = None) -> dict[str, Any]:
    """The live figures of one queue, for staff (a Redis round trip for the queue, one for the site's
    health, one for the viewers)."""
    snap = store.snapshot(slug)
    st, cfg = snap.stats, snap.config
    if cfg.get("mode") == "stateless":
        return _window_stats(slug, cfg, now)
    site = site_health_get(slug=slug, now=now, window_seconds=health_window_seconds(cfg))

    def count(name: str) -> int:
        return int(st.get(name, 0))

    capacity = int(cfg.get("capacity", 0) or 0)
    used = snap.admitted + snap.active
    if cfg.get("capacity_source") == "reported":
        used = count("reported_in_use") + snap.admitted
    observed = observed_per_minute(float(st.get("ema_rate", 0) or 0), int(float(st.get("ema_ts", 0) or 0)), now)
    expired = count("expired_claim") + count("expired_session") + count("abandoned") + count("left")
    return {
        "slug": slug,
        "state": cfg.get("state", "unknown"),
        "waiting": snap.waiting,
        "waiting_away": snap.away,
        "head_position": snap.head_seq,
        "admitted": snap.admitted,
        "active": snap.active,
        "capacity": capacity,
        "capacity_source": cfg.get("capacity_source", "counted"),
        "capacity_in_use": used,
        "capacity_use": round(used / capacity, 4) if capacity else None,
        "reported_in_use": count("reported_in_use") if "reported_in_use" in st else None,
        "outflow_per_minute_configured": float(cfg.get("outflow_per_minute", 0) or 0),
        "outflow_per_minute_observed": round(observed, 3),
        "outflow_per_minute_effective": round(outflow_in_force(cfg, st), 3),
        "adaptive_outflow": cfg.get("adaptive_outflow") == "1",
        "site_health": site.payload(),
        "average_wait_seconds": round(float(st["ema_wait_ms"]) / 1000, 1) if "ema_wait_ms" in st else None,
        "average_service_seconds": (round(float(st["ema_service_ms"]) / 1000, 1) if "ema_service_ms" in st else None),
        "totals": {
            "joined": count("joined"),
            "admitted": count("admitted"),
            "activated": count("activated"),
            "completed": count("completed"),
            "expired": expired,
            "left": count("left"),
            "abandoned": count("abandoned"),
            "expired_claim": count("expired_claim"),
            "expired_session": count("expired_session"),
            "revoked": count("revoked"),
            "restored": count("restored"),
            "restored_sessions": count("restored_sessions"),
        },
        "event_seq": count("evseq"),
        "epoch": int(cfg.get("epoch") or 1),
        "viewers": store.viewers_count(slug, now=time.time() if now is None else now),
    }


def queue_snapshot_get(slug: str) -> store.QueueSnapshot:
    """A tracked queue's counters and sizes in one round trip (admin's list)."""
    return store.snapshot(slug)


def queue_sessions_get(slug: str, *, limit: int) -> list[tuple[str, str, int]]:
    """(ticket id, 'admitted' | 'active', claim deadline or session end in ms), soonest first."""
    return store.sessions_list(slug, limit=limit)


def wait_samples_get(slug: str, *, limit: int = 10000) -> list[store.WaitSample]:
    """The oldest wait samples admissions left in Redis (kept there until services.wait_samples_drop)."""
    return store.wait_samples_read(slug, limit=limit)


def queue_policy_get(slug: str) -> dict[str, str]:
    """The queue's policy as mirrored in Redis (no SQL); PolicyMissing when Redis has none."""
    policy = store.config_read(slug)
    if not policy:
        raise PolicyMissing(slug)
    return policy


def queue_shuffle_get(*, slug: str) -> dict[str, Any] | None:
    """The public record of the queue's latest scheduled start's shuffle (commitment; seed once revealed)."""
    from .models import QueueShuffle

    record = QueueShuffle.objects.filter(queue__slug=slug).order_by("-starts_at").first()
    return shuffle.public_record(record) if record is not None else None


# --- Stateless mode (SPEC 4): a ticket's state follows from its number and the window -------------------

EXPIRED_WINDOW = "expired_window"  # why a stateless ticket expired: the window passed it


MODE_CACHE_SECONDS = 2.0
_modes: dict[str, tuple[float, str]] = {}


def queue_mode_get(slug: str) -> str:
    """A queue's mode (tracked | stateless), as mirrored in Redis; remembered per process for a moment
    (a join must know which way to go; the scripts refuse the wrong one, so a stale answer costs a retry)."""
    now = time.monotonic()
    cached = _modes.get(slug)
    if cached is not None and now - cached[0] < MODE_CACHE_SECONDS:
        return cached[1]
    mode = store.config_read(slug).get("mode")
    if mode is None:
        queue = Queue.objects.filter(slug=slug).only("mode").first()
        mode = queue.mode if queue is not None else Queue.Mode.TRACKED
    if len(_modes) > 10_000:
        _modes.clear()
    _modes[slug] = (now, mode)
    return mode


def queue_mode_forget(slug: str) -> None:
    _modes.pop(slug, None)


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
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    place = window_place(window, claims.number)
    started = now_ms >= window.starts_ms and not window.shuffle_pending
    interval = window.interval_ms / 1000
    access_token = redirect_url = None
    expires_at = None
    position = ahead = estimate = None
    reason = ""
    if not started or place > window.active:
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
            slug=slug, ticket_id=claims.ticket_id, fence=0, expires_ms=expires_ms, epoch=claims.epoch, stateless=True
        )
        redirect_url = _with_query(window.target_url, **{settings.WR_ACCESS_QUERY_PARAM: access_token})
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


def position_status_get(
    *, claims: tokens.PositionClaims, now: float | None = None, limit_scope: str = ""
) -> TicketView:
    """A stateless ticket's status: one Redis read (with the ticket's rate limiter in the same round trip
    when `limit_scope` is given; ratelimit.Limited when it refuses). PolicyMissing without a live window."""
    slug = claims.slug
    call = ratelimit.prepare(limit_scope, claims.ticket_id, now=now) if limit_scope else None
    if call is None:
        window = store.window_read(slug, ticket_epoch=claims.epoch)
    else:
        window, limited = store.window_read_limited(slug, ticket_epoch=claims.epoch, limit=call)
        decision = ratelimit.decision_from(limited)
        if not decision.allowed:
            raise ratelimit.Limited(decision)
    if not window.live:
        raise PolicyMissing(slug)
    return position_view(slug, claims, window, now_ms=int((time.time() if now is None else now) * 1000))


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


def window_public_get(*, slug: str, now: float | None = None) -> dict[str, Any]:
    """The window endpoint's answer (one HMGET; no ticket, no per-visitor state). PolicyMissing without a
    live window (a tracked or unknown queue, or lost state)."""
    window = store.window_read(slug)
    if not window.live:
        raise PolicyMissing(slug)
    return window_public(window, now_ms=int((time.time() if now is None else now) * 1000))


def _window_stats(slug: str, cfg: dict[str, str], now: float | None) -> dict[str, Any]:
    """queue_stats_get for a stateless queue: what a window can know (no presence, sessions or waits)."""
    now = time.time() if now is None else now
    window = store.window_read(slug)
    in_window = max(0, min(window.active, window.issued) - max(0, window.active - window.windows * window.size))
    capacity = int(cfg.get("capacity", 0) or 0)
    observed = observed_per_minute(window.ema_rate, window.ema_ts_ms, now)
    configured = window.size / (window.interval_ms / 60000)
    return {
        "slug": slug,
        "mode": "stateless",
        "state": cfg.get("state", "unknown"),
        "waiting": max(0, window.issued - window.active),
        "waiting_away": 0,
        "head_position": window.active + 1,
        "admitted": 0,
        "active": in_window,
        "capacity": capacity,
        "capacity_source": cfg.get("capacity_source", "counted"),
        "capacity_in_use": in_window,
        "capacity_use": round(in_window / capacity, 4) if capacity else None,
        "reported_in_use": None,
        "outflow_per_minute_configured": round(configured, 3),
        "outflow_per_minute_observed": round(observed, 3),
        "outflow_per_minute_effective": round(configured, 3),
        "adaptive_outflow": False,
        "site_health": site_health_get(slug=slug, now=now, window_seconds=health_window_seconds(cfg)).payload(),
        "average_wait_seconds": None,
        "average_service_seconds": None,
        "totals": {
            "joined": window.issued,
            "admitted": window.admitted,
            "activated": 0,
            "completed": 0,
            "expired": 0,
            "left": 0,
            "abandoned": 0,
            "expired_claim": 0,
            "expired_session": 0,
            "revoked": 0,
            "restored": 0,
            "restored_sessions": 0,
        },
        "event_seq": window.evseq,
        "epoch": window.epoch,
        "viewers": store.viewers_count(slug, now=now),
        "window": window_public(window, now_ms=int(now * 1000)),
    }
