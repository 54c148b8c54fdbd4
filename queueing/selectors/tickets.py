"""A tracked queue's ticket as its visitor sees it: its status (a poll is also its heartbeat), the advice
on when to poll again, the admission link, and the visitors around it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from django.conf import settings

from .. import clock, flows, ratelimit, realtime, store, tokens
from ..store import PollFigures, StatusReply, TicketReply, TicketState, TicketStatus

T = TypeVar("T")


class TicketGone(Exception):
    """The ticket is signed but its queue no longer knows it."""


class PolicyMissing(Exception):
    """Redis has no policy (or no live window) for the queue: a new queue, or lost state. Sync, read again."""


@dataclass(slots=True)
class TicketView:
    """What the API and pages show a visitor about its ticket. Built once a poll and never changed after
    (not frozen: a frozen dataclass's __init__, a call to object.__setattr__ per field, cost a poll 2 µs)."""

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
    estimated_wait_range: list[int] | None = None  # [low, high] seconds: ~8 in 10 of the queue's waits fall within
    drawn_at_start: bool = False  # in a pre-queue: its place is drawn at the start (no place until then)
    place: int | None = None  # stateless mode: the ticket's place (its number, shuffled, less its epoch's gap)
    # The wait rests on a slot held by a visitor who seems to have left the site without finishing: it
    # frees at the latest then (epoch s), earlier if they finish (lua/_holds.lua returns_look).
    held_slot_ends_at: int | None = None
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
            estimated_wait_range=self.estimated_wait_range,
            poll_after_seconds=self.poll_after_seconds,
            queue_state=self.queue_state,
            event_seq=self.event_seq,
            epoch=self.epoch,  # event sequences start again in a new epoch (after lost state)
        )
        if self.opens_in_seconds is not None:
            body["opens_in_seconds"] = self.opens_in_seconds
        if self.drawn_at_start:
            body["place_drawn_at_start"] = True
        if self.held_slot_ends_at is not None:
            body["held_slot_ends_at"] = self.held_slot_ends_at
        if self.access_token:
            body.update(access_token=self.access_token, redirect_url=self.redirect_url, expires_at=self.expires_at)
        if self.reason:
            body["reason"] = self.reason  # why a finished ticket finished
        if self.window is not None:
            body.update(mode="stateless", number=self.seq, place=self.place, window=self.window)
        return body


def heartbeat_ceiling(figures: PollFigures) -> float:
    """The longest gap between two sightings of a visitor that keeps it present and its admission
    noticed: a third of the presence timeout, half the claim TTL, never under 2 s."""
    return sighting_ceiling(figures.presence_timeout_s, figures.claim_ttl_s)


def sighting_ceiling(presence_timeout_s: float, claim_ttl_s: float) -> float:
    """heartbeat_ceiling from the two timeouts (a websocket server's roll call reads them)."""
    return max(2.0, min(presence_timeout_s / 3, claim_ttl_s / 2))


def poll_after_seconds(ticket: TicketState, figures: PollFigures, rng: random.Random | None = None) -> float:
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


def with_query(url: str, **params: str) -> str:
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
    return access_token, with_query(target_url, **{settings.WR_ACCESS_QUERY_PARAM: access_token})


def opens_in_seconds(figures: PollFigures, now_ms: int) -> int | None:
    if figures.starts_at_ms <= now_ms:
        return None
    return math.ceil((figures.starts_at_ms - now_ms) / 1000)


def ticket_view(slug: str, reply: TicketReply | StatusReply, *, now_ms: int | None = None) -> TicketView:
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
    now_ms = clock.now_ms() if now_ms is None else now_ms
    # Before a scheduled start the pre-queue's order is not drawn yet: no place to show, and the wait is
    # the pre-queue's middle one, ranging from the first place to the last (lua/_estimates.lua estimate_told).
    drawn = waiting and figures.starts_at_ms > now_ms
    if drawn:
        estimate_range = _drawn_range(ticket.est_wait_s, (figures.starts_at_ms - now_ms) / 1000)
    else:
        estimate_range = figures.wait_range(ticket.est_wait_s) if waiting else None
    held_until = None
    gone_left_s = (figures.held_gone_until_ms - now_ms) // 1000 if figures.held_gone_until_ms > now_ms else None
    # the estimate is that slot's end (rounded up, at the next tick): the wait rests on it. A visitor further
    # back, told more, waits for other slots too; one told less, for slots of visitors still there.
    if (
        waiting
        and not drawn
        and ticket.est_wait_s is not None
        and gone_left_s is not None
        and gone_left_s <= ticket.est_wait_s <= gone_left_s + 2
    ):
        held_until = figures.held_gone_until_ms // 1000
        estimate_range = [0, ticket.est_wait_s]  # it may free any moment, and no later than its end
    return TicketView(
        ticket_id=ticket.ticket_id,
        status=public_status(ticket.status),
        position=(ticket.rank or 0) + 1 if waiting and not drawn else None,
        ahead=ticket.rank if waiting and not drawn else None,
        queue_length=figures.waiting,
        estimated_wait_seconds=ticket.est_wait_s if waiting else None,
        estimated_wait_range=estimate_range,
        drawn_at_start=drawn,
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
        held_slot_ends_at=held_until,
    )


def _drawn_range(estimate: int | None, until_start: float) -> list[int] | None:
    """Over the draw: from the first place (the start) to the last (twice the middle place's wait)."""
    if estimate is None:
        return None
    low = math.ceil(until_start)
    return [low, max(low, math.ceil(until_start + 2 * (estimate - until_start)))]


@dataclass(frozen=True)
class Polled(Generic[T]):
    """A visitor's read as its plan read it, and the events it must publish (a poll that brought a parked
    visitor back to its place moved those behind it) before its answer, or its `refusal`, is given."""

    value: T
    messages: list[realtime.Message] = field(default_factory=list)
    refusal: Exception | None = None

    def outcome(self) -> T:
        if self.refusal is not None:
            raise self.refusal
        return self.value


def polled_flow(plan: store.Plan[Polled[T]]) -> flows.Flow[T]:
    """A visitor's read (its plan), and what it moved published before its answer, or its refusal."""
    result = yield from flows.execute(plan)
    yield from flows.publish(result.messages)
    return result.outcome()


def polled(plan: store.Plan[Polled[T]]) -> T:
    """`polled_flow` from synchronous code."""
    return flows.drive(polled_flow(plan))


def limit_decided(limited: store.LimitReply | None) -> None:
    """ratelimit.Limited when the limiter that ran with a read refused it."""
    if limited is not None:
        decision = ratelimit.decision_from(limited)
        if not decision.allowed:
            raise ratelimit.Limited(decision)


def ticket_status_plan(
    *, claims: tokens.TicketClaims, now: float | None = None, limit_scope: str = ""
) -> store.Plan[Polled[TicketView]]:
    """A ticket's state; the poll also counts as the visitor's heartbeat. One Redis round trip, one script
    (with the ticket's rate limiter in it when `limit_scope` is given).

    Reading it raises TicketGone when the queue does not know the ticket (finished long ago, or replaced
    by the visitor's newer ticket; the API reports that as `expired`), PolicyMissing when Redis lost the
    queue's policy, ratelimit.Limited."""
    restore = store.Restore(claims.epoch, claims.priority, claims.placement, claims.issued_at * 1000)
    return visitor_status_plan(
        slug=claims.slug,
        visitor_key=claims.visitor_key,
        seq=claims.seq,
        now=now,
        limit_scope=limit_scope,
        restore=restore,
    )


def visitor_status_plan(
    *,
    slug: str,
    visitor_key: str,
    seq: int = 0,
    now: float | None = None,
    limit_scope: str = "",
    restore: store.Restore = store.NO_RESTORE,
) -> store.Plan[Polled[TicketView]]:
    """As ticket_status_plan; seq 0 means whatever ticket the visitor has (the no-JavaScript page)."""
    now_ms = clock.now_ms(now)
    call = ratelimit.prepare(limit_scope, visitor_key, now=now, queue=slug) if limit_scope else None

    def read(replies: tuple[StatusReply, store.LimitReply | None]) -> Polled[TicketView]:
        reply, limited = replies
        limit_decided(limited)
        if reply.outcome == "no_config":
            raise PolicyMissing(slug)  # rare: Redis lost the policy
        # A parked visitor came back to its place: the only way a poll moves anyone.
        messages = realtime.queue_move(slug, reply.moves) if reply.moves.seq else []
        if reply.outcome != "ok":
            return Polled(None, messages, TicketGone(slug))  # type: ignore[arg-type]
        return Polled(ticket_view(slug, reply, now_ms=now_ms), messages)

    plan = store.status_plan(slug, visitor_key=visitor_key, seq=seq, now_ms=now_ms, limit=call, restore=restore)
    return plan.then(read)


def visitor_status_get(
    *,
    slug: str,
    visitor_key: str,
    seq: int = 0,
    now: float | None = None,
    limit_scope: str = "",
    restore: store.Restore = store.NO_RESTORE,
) -> TicketView:
    """visitor_status_plan, run."""
    plan = visitor_status_plan(
        slug=slug, visitor_key=visitor_key, seq=seq, now=now, limit_scope=limit_scope, restore=restore
    )
    return polled(plan)


@dataclass(frozen=True)
class NeighbourView:
    position: int
    display_name: str
    is_me: bool


def ticket_neighbours_get(*, claims: tokens.TicketClaims, before: int = 3, after: int = 3) -> list[NeighbourView]:
    """The few visitors around this one in line (seed 004's visual line), in one round trip; none before
    a scheduled start, whose draw makes the order (as status gives no place then)."""
    _, rows = store.neighbours(
        claims.slug, visitor_key=claims.visitor_key, seq=claims.seq, before=before, after=after, now_ms=clock.now_ms()
    )
    return [NeighbourView(row.rank + 1, row.display_name, row.is_me) for row in rows]
