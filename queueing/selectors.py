"""Every read: a ticket's status (also its heartbeat), queue stats, the advice a poller gets."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from django.conf import settings

from . import health, ratelimit, realtime, store, tokens
from .models import Queue
from .store import QueueFigures, TicketReply, TicketState, TicketStatus

RATE_TAU_S = 30  # as in lua/_lib.lua


class TicketGone(Exception):
    """The ticket is signed but its queue no longer knows it."""


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
        from .services import queue_config_sync  # rare: Redis lost the policy

        queue = Queue.objects.prefetch_related("priority_levels").filter(slug=slug).first()
        if queue is None:
            raise TicketGone(slug)
        queue_config_sync(queue)
        reply = store.status(slug, visitor_key=visitor_key, seq=seq, now_ms=now_ms, restore=restore)
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
    return store.health_window(slug, now_ms=now_ms, seconds=window_seconds)


def queue_stats_get(*, slug: str, now: float | None = None) -> dict[str, Any]:
    """The live figures of one queue, for staff (a Redis round trip for the queue, one for the site's
    health, one for the viewers)."""
    snap = store.snapshot(slug)
    st, cfg = snap.stats, snap.config
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


def queue_shuffle_get(*, slug: str) -> dict[str, Any] | None:
    """The public record of the queue's latest scheduled start's shuffle (commitment; seed once revealed)."""
    from .models import QueueShuffle

    record = QueueShuffle.objects.filter(queue__slug=slug).order_by("-starts_at").first()
    return record.public() if record is not None else None
