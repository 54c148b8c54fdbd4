"""What differs between a tracked and a stateless queue (SPEC 3 and 4), as seen from a visitor: one
interface, one implementation per mode, chosen here and nowhere else.

* by the ticket a visitor holds (`of_claims`: a tracked queue's ticket or a stateless queue's number),
  for status polls, websockets, rate limits, neighbours and leaving;
* by the queue (`of_queue`: its mode as mirrored in Redis), for joins and the waiting page. A queue may
  change mode while a join is under way: the script then refuses it (services.WrongMode), and `join`
  asks again which mode the queue is in and joins the other way.

A read that finds the queue's policy missing from Redis (a new queue, lost state) has it synced from the
database once, here (services.with_policy), so no face or selector has to.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar, Generic, TypeVar

from . import caching, flows, pow, realtime, selectors, services, signing_keys, store, tokens
from .models import Queue
from .selectors import NeighbourView, Polled, TicketGone, TicketView
from .visitors import VisitorIdentity

C = TypeVar("C", tokens.TicketClaims, tokens.PositionClaims)
T = TypeVar("T")


@dataclass(frozen=True)
class Visit:
    """A join as a face received it (the API, or the waiting page's form)."""

    slug: str
    identify: Callable[[], VisitorIdentity]  # who the visitor is (tracked mode asks; InvalidVisitorId)
    held_ticket: str = ""  # the stateless queue's ticket this browser already holds (its cookie)
    address: str = ""
    priority_code: str = ""
    display_name: str = ""
    proof: pow.Solved | None = None


@dataclass(frozen=True)
class Promoted:
    """A code entered while waiting: whether it moved the visitor (else its level was that high already),
    its place before (1-based; None in a pre-queue, whose places are drawn at the start), the ticket signed
    again with its new level and place, and its state now."""

    promoted: bool
    position_before: int | None
    ticket: str
    view: TicketView


@dataclass(frozen=True)
class Joined:
    """A join's outcome: the signed ticket, the state it is in, and what to remember in the browser."""

    created: bool
    ticket: str
    view: TicketView
    visitor_cookie: str | None = None  # a fresh visitor identity to set
    position_cookie: bool = False  # remember `ticket` as the browser's stateless ticket (dedupe, SPEC 4)


def _ensured(slug: str, read: Callable[[], T], *, mode: str = "") -> T:
    """A visitor's read, with the queue's policy synced once if Redis lost it; TicketGone if it cannot be."""
    return flows.drive(_ensured_flow(slug, lambda: flows.done(read), mode=mode))


def _ensured_flow(slug: str, read: Callable[[], flows.Flow[T]], *, mode: str = "") -> flows.Flow[T]:
    try:
        return (yield from services.policy_flow(slug, read, mode=mode))
    except (services.QueueNotFound, selectors.PolicyMissing) as exc:
        raise TicketGone(slug) from exc


class QueueMode(ABC, Generic[C]):
    name: ClassVar[str]
    # Per-visitor state in Redis: private events (admitted, expired), presence kept by the socket's
    # status reads, neighbours in line, leaving. A stateless queue keeps none.
    keeps_visitors: ClassVar[bool]

    @abstractmethod
    def status_plan(
        self, claims: C, *, limit_scope: str = "", now: float | None = None
    ) -> store.Plan[Polled[TicketView]]:
        """The ticket's state as one round trip's plan (reading it: TicketGone when its queue no longer
        knows it; ratelimit.Limited; PolicyMissing when Redis lost the queue's policy)."""

    def status(self, claims: C, *, limit_scope: str = "", now: float | None = None) -> TicketView:
        """The ticket's state (`status_flow`) from synchronous code."""
        return flows.drive(self.status_flow(claims, limit_scope=limit_scope, now=now))

    def status_flow(self, claims: C, *, limit_scope: str = "", now: float | None = None) -> flows.Flow[TicketView]:
        """The ticket's state (TicketGone when its queue no longer knows it; ratelimit.Limited), its limiter
        in the same round trip. Only when Redis lost the queue's policy (synced once), or an admitted
        visitor's access token needs signing keys this process has not loaded yet, is it read again: without
        the limiter (the poll was counted once)."""
        try:
            return (yield from selectors.polled_flow(self.status_plan(claims, limit_scope=limit_scope, now=now)))
        except selectors.PolicyMissing:
            pass
        except signing_keys.KeysNotLoaded:  # only ever on the event loop: loaded in a thread
            yield from flows.blocking(signing_keys.key_ring)
        plan = partial(self.status_plan, claims, now=now)
        return (yield from _ensured_flow(claims.slug, lambda: selectors.polled_flow(plan()), mode=self.name))

    @abstractmethod
    def join_flow(self, visit: Visit, limit: store.LimitCall | None) -> flows.Flow[Joined]:
        """A ticket for the visitor (services.JOIN_REFUSALS; services.WrongMode: see `join_flow` below). The
        join's rate limiter (`limit`) is counted before any other work in Redis (ratelimit.Limited)."""

    @abstractmethod
    def promote(self, claims: C, *, code: str, address: str = "") -> Promoted:
        """A priority code the visitor entered while waiting (services.ticket_promote's refusals;
        services.NoPriorityLanes where the queue has none)."""

    @abstractmethod
    def holder(self, claims: C) -> str:
        """Whom the ticket's requests are counted against by the rate limiters."""

    @abstractmethod
    def private_group(self, claims: C) -> str:
        """The channel group of the ticket's own events ('' when it has none)."""

    @abstractmethod
    def neighbours(self, claims: C) -> list[NeighbourView]:
        """The few visitors around this one in line (none for a queue that knows numbers, not people)."""

    @abstractmethod
    def leave(self, claims: C) -> None:
        """The visitor gives up the ticket."""

    @abstractmethod
    def held(self, slug: str, *, identity: VisitorIdentity, held_ticket: str) -> TicketView | None:
        """The ticket this visitor holds now, if any (the waiting page without JavaScript)."""


class Tracked(QueueMode[tokens.TicketClaims]):
    """Every visitor has a record and a place in the line in Redis (SPEC 3)."""

    name = Queue.Mode.TRACKED
    keeps_visitors = True

    def status_plan(
        self, claims: tokens.TicketClaims, *, limit_scope: str = "", now: float | None = None
    ) -> store.Plan[Polled[TicketView]]:
        return selectors.ticket_status_plan(claims=claims, now=now, limit_scope=limit_scope)

    def join_flow(self, visit: Visit, limit: store.LimitCall | None) -> flows.Flow[Joined]:
        identity = visit.identify()
        signed_in = bool(getattr(identity.user, "is_authenticated", False))
        if identity.former or signed_in:  # reads before the join's script: the limiter counts first
            yield from selectors.limit_flow(limit)
            limit = None
        if identity.former:
            kept = yield from flows.blocking(lambda: self._from_before_rotation(visit.slug, identity))
            if kept is not None:  # a ticket from before the secret's rotation: that one, not a new one at the back
                return Joined(False, self._ticket(visit.slug, kept), kept, visitor_cookie=identity.new_cookie)
        priority = 0
        if signed_in:
            priority = yield from flows.blocking(
                lambda: services.priority_for_user(slug=visit.slug, user=identity.user)
            )
        result = yield from services.queue_join_flow(
            slug=visit.slug,
            visitor_key=identity.key,
            priority=priority,
            priority_code=visit.priority_code,
            display_name=visit.display_name,
            address=visit.address,
            proof=visit.proof,
            limit=limit,
        )
        return (yield from _signed(lambda: self.joined(visit.slug, result, identity)))

    def joined(self, slug: str, result: services.JoinResult, identity: VisitorIdentity) -> Joined:
        view = selectors.ticket_view(slug, result.reply)
        return Joined(result.created, self._ticket(slug, view), view, visitor_cookie=identity.new_cookie)

    @staticmethod
    def _ticket(slug: str, view: TicketView) -> str:
        return tokens.ticket_issue(
            slug=slug,
            ticket_id=view.ticket_id,
            seq=view.seq,
            priority=view.priority,
            epoch=view.epoch,
            placement=view.placement,
        )

    @staticmethod
    def _from_before_rotation(slug: str, identity: VisitorIdentity) -> TicketView | None:
        """The visitor's live ticket under a key from before SECRET_KEY was rotated (SECRET_KEY_FALLBACKS),
        if they have none under the current one. Nothing to look up unless fallbacks are set."""
        if not identity.former:
            return None
        try:
            selectors.visitor_status_get(slug=slug, visitor_key=identity.key)
            return None  # a ticket under the current key: the join finds it
        except (TicketGone, selectors.PolicyMissing):
            pass
        for former in identity.former:
            try:
                view = selectors.visitor_status_get(slug=slug, visitor_key=former)
            except (TicketGone, selectors.PolicyMissing):
                continue
            if view.status in ("waiting", "admitted", "active"):
                return view
        return None

    def promote(self, claims: tokens.TicketClaims, *, code: str, address: str = "") -> Promoted:
        promotion = services.ticket_promote(
            slug=claims.slug, visitor_key=claims.visitor_key, seq=claims.seq, code=code, address=address
        )
        # Signed again with its level and place, so a restore after lost state puts it where it is now.
        moved = replace(claims, priority=promotion.ticket.priority, placement=promotion.ticket.score)
        ticket = tokens.ticket_issue(
            slug=moved.slug,
            ticket_id=moved.ticket_id,
            seq=moved.seq,
            priority=moved.priority,
            epoch=moved.epoch,
            placement=moved.placement,
        )
        view = self.status(moved)
        # A pre-queue's order before the draw is no place (the draw orders by level): none before, none now.
        before = None if view.drawn_at_start else promotion.before + 1
        return Promoted(promotion.promoted, before, ticket, view)

    def holder(self, claims: tokens.TicketClaims) -> str:
        return claims.visitor_key

    def private_group(self, claims: tokens.TicketClaims) -> str:
        return realtime.ticket_group(claims.slug, claims.visitor_key)

    def neighbours(self, claims: tokens.TicketClaims) -> list[NeighbourView]:
        return selectors.ticket_neighbours_get(claims=claims)

    def leave(self, claims: tokens.TicketClaims) -> None:
        services.ticket_leave(slug=claims.slug, claims=claims)

    def held(self, slug: str, *, identity: VisitorIdentity, held_ticket: str) -> TicketView | None:
        for key in (identity.key, *identity.former):  # former: keys from before a rotation of the secret
            try:
                return _ensured(slug, partial(selectors.visitor_status_get, slug=slug, visitor_key=key))
            except TicketGone:
                continue
        return None


class Stateless(QueueMode[tokens.PositionClaims]):
    """A ticket is its number; its state follows from the number and the queue's window (SPEC 4)."""

    name = Queue.Mode.STATELESS
    keeps_visitors = False

    def status_plan(
        self, claims: tokens.PositionClaims, *, limit_scope: str = "", now: float | None = None
    ) -> store.Plan[Polled[TicketView]]:
        return selectors.position_status_plan(claims=claims, now=now, limit_scope=limit_scope)

    def join_flow(self, visit: Visit, limit: store.LimitCall | None) -> flows.Flow[Joined]:
        """A new number, or (dedupe by signed cookie only) the ticket this browser already holds while it
        is not finished. Nothing is stored per visitor."""
        if visit.priority_code:
            raise services.NoPriorityLanes(visit.priority_code)
        kept = self._held_claims(visit.held_ticket, visit.slug)
        if kept is not None:
            yield from selectors.limit_flow(limit)  # the held ticket is read first: the limiter counts before
            limit = None
            held = yield from self._held_view(kept)
            if held is not None and not held.is_finished:
                return Joined(False, visit.held_ticket, held, position_cookie=True)
        window = yield from services.stateless_join_flow(slug=visit.slug, proof=visit.proof, limit=limit)
        return (yield from _signed(lambda: self.joined(visit.slug, window)))

    @staticmethod
    def joined(slug: str, window: store.Window) -> Joined:
        """The new number's ticket (the window as the join left it)."""
        claims = tokens.PositionClaims(slug, window.next_number, window.epoch, int(time.time()), window.queue_id)
        ticket = tokens.position_issue(slug=slug, number=claims.number, epoch=claims.epoch, queue_id=window.queue_id)
        return Joined(True, ticket, selectors.position_view(slug, claims, window), position_cookie=True)

    def promote(self, claims: tokens.PositionClaims, *, code: str, address: str = "") -> Promoted:
        raise services.NoPriorityLanes(code)

    def holder(self, claims: tokens.PositionClaims) -> str:
        return claims.ticket_id

    def private_group(self, claims: tokens.PositionClaims) -> str:
        return ""

    def neighbours(self, claims: tokens.PositionClaims) -> list[NeighbourView]:
        return []

    def leave(self, claims: tokens.PositionClaims) -> None:
        return None  # a stateless ticket is simply not used again

    def held(self, slug: str, *, identity: VisitorIdentity | None, held_ticket: str) -> TicketView | None:
        kept = self._held_claims(held_ticket, slug)
        return None if kept is None else flows.drive(self._held_view(kept))

    @staticmethod
    def _held_claims(held_ticket: str, slug: str) -> tokens.PositionClaims | None:
        """What a kept stateless ticket carries (no I/O); None for none, a stale one or a tracked one."""
        if not held_ticket:
            return None
        try:
            claims = tokens.visitor_ticket_decode(held_ticket, slug=slug)
        except tokens.InvalidTicket:
            return None  # a stale cookie
        return claims if isinstance(claims, tokens.PositionClaims) else None  # a tracked ticket: not this mode's

    def _held_view(self, claims: tokens.PositionClaims) -> flows.Flow[TicketView | None]:
        try:
            return (yield from self.status_flow(claims))
        except TicketGone:
            return None


TRACKED = Tracked()
STATELESS = Stateless()
_BY_NAME: dict[str, QueueMode[Any]] = {TRACKED.name: TRACKED, STATELESS.name: STATELESS}
_BY_CLAIMS: dict[type, QueueMode[Any]] = {tokens.TicketClaims: TRACKED, tokens.PositionClaims: STATELESS}


def of_claims(claims: tokens.VisitorClaims) -> QueueMode[Any]:
    """The mode of the queue that issued this ticket."""
    return _BY_CLAIMS[type(claims)]


def named(name: str | None) -> QueueMode[Any]:
    """The mode of that name (a queue's `mode`; none: tracked, the default)."""
    return _BY_NAME.get(name or "", TRACKED)


def of_queue(slug: str) -> QueueMode[Any]:
    """The queue's mode now (as mirrored in Redis, remembered per process for a moment)."""
    return named(selectors.queue_mode_get(slug))


def status(claims: tokens.VisitorClaims, *, limit_scope: str = "", now: float | None = None) -> TicketView:
    """Any ticket's state, read the way its queue's mode reads it."""
    return of_claims(claims).status(claims, limit_scope=limit_scope, now=now)


async def astatus(claims: tokens.VisitorClaims, *, limit_scope: str = "") -> TicketView:
    """`status` from the web server's event loop: the same flow, its round trip awaited there."""
    return await flows.adrive(of_claims(claims).status_flow(claims, limit_scope=limit_scope))


def join(visit: Visit) -> Joined:
    """`join_flow` from synchronous code, its limiter counted apart."""
    return flows.drive(join_flow(visit))


def join_flow(visit: Visit, *, limit: store.LimitCall | None = None) -> flows.Flow[Joined]:
    """Join the queue the way its mode joins, as this process last knew its mode (tracked when it does not
    know: the script refuses a join of the wrong mode). If the mode was not the one tried (it changed a
    moment ago, or was not known), the queue's mode is read and the join made that way, without the limiter
    (`limit`, which the refused try counted)."""
    try:
        return (yield from named(selectors.queue_mode_known(visit.slug)).join_flow(visit, limit))
    except services.WrongMode:
        selectors.queue_mode_forget(visit.slug)
    mode = yield from flows.blocking(lambda: of_queue(visit.slug))
    return (yield from mode.join_flow(visit, None))  # a second WrongMode: the queue flips back and forth


def _signed(joined: Callable[[], Joined]) -> flows.Flow[Joined]:
    """A join's outcome with its tokens signed: here, or in a thread while this process has no signing keys
    (an access token for a visitor let through at once, on the event loop; loading them reads the database)."""
    try:
        return joined()
    except signing_keys.KeysNotLoaded:
        return (yield from flows.blocking(joined))


async def aclose() -> None:
    """Close the event loop's Redis client (the web server's shutdown)."""
    await store.aclose()


def window_public_flow(slug: str, *, address: Callable[[], str]) -> flows.Flow[dict[str, Any]]:
    """A stateless queue's public window. TicketGone for a tracked or unknown queue, which is remembered
    for a few seconds (in this process, then in the shared cache): a crowd asking for a window that is not
    there costs the database nothing, and a repeated miss costs no round trip after the window's own read.
    A miss known to neither reads the database, so those are counted per client (`address` gives it;
    ratelimit.Limited; scope `window_miss`): made-up slugs cannot make every request a query."""
    try:  # one HMGET: a live stateless queue's answer
        return (yield from selectors.polled_flow(selectors.window_public_plan(slug=slug)))
    except selectors.PolicyMissing:
        pass
    refused = caching.window_refused_key(slug)
    if caching.local_cached(refused):
        raise TicketGone(slug)
    if (yield from flows.blocking(lambda: caching.cached(refused))):
        caching.local_remember(refused, True, caching.WINDOW_REFUSED_LOCAL_SECONDS)
        raise TicketGone(slug)
    client = address()
    if client:
        yield from selectors.limit_flow(selectors.limit_call("window_miss", client))
    try:
        plan = selectors.window_public_plan
        return (yield from _ensured_flow(slug, lambda: selectors.polled_flow(plan(slug=slug)), mode=STATELESS.name))
    except TicketGone:
        # A switch to stateless mode that lands between the read above and this line is answered 404 for
        # at most WINDOW_REFUSED_SECONDS (its invalidation ran before this entry was written).
        yield from flows.blocking(lambda: caching.remember(refused, True, caching.WINDOW_REFUSED_SECONDS))
        caching.local_remember(refused, True, caching.WINDOW_REFUSED_LOCAL_SECONDS)
        raise
