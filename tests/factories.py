"""Helpers shared by tests: a controlled clock and shorthands for engine calls."""

from __future__ import annotations

import time

from queueing import services, store, tokens


class Clock:
    """A controlled clock: services take `now`, so tests move time instead of sleeping."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def visitor(name: str) -> str:
    """The visitor key of a named test visitor."""
    return tokens.visitor_key(f"test:{name}")


def join(
    slug: str, name: str, *, now: float | None = None, priority: int = 0, display_name: str = ""
) -> store.TicketState:
    return services.queue_join(
        slug=slug, visitor_key=visitor(name), priority=priority, display_name=display_name, now=now
    ).ticket


def status_reply(slug: str, ticket: store.TicketState, *, now: float) -> store.StatusReply:
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    return store.status(slug, visitor_key=parsed[1], seq=parsed[0], now_ms=int(now * 1000))


def status(slug: str, ticket: store.TicketState, *, now: float) -> store.TicketState:
    """The ticket as a poll now sees it (it must still be known)."""
    reply = status_reply(slug, ticket, now=now)
    assert reply.ticket is not None, reply.outcome
    return reply.ticket


def access_token(slug: str, ticket: store.TicketState) -> str:
    """The access token an admitted ticket's visitor would carry to the protected site."""
    return tokens.access_token_issue(
        slug=slug, ticket_id=ticket.ticket_id, fence=ticket.fence, expires_ms=ticket.expires_ms
    )


def access_claims(slug: str, ticket: store.TicketState) -> tokens.AccessClaims:
    return tokens.access_token_decode(access_token(slug, ticket), slug=slug)


def ticket_token(slug: str, ticket: store.TicketState) -> str:
    return tokens.ticket_issue(slug=slug, ticket_id=ticket.ticket_id, seq=ticket.seq, priority=ticket.priority, epoch=1)


def decode_ticket(raw: str, *, slug: str) -> tokens.TicketClaims:
    """A tracked queue's ticket's claims (InvalidTicket as the product decodes it; not a numbered one)."""
    claims = tokens.visitor_ticket_decode(raw, slug=slug)
    assert isinstance(claims, tokens.TicketClaims)
    return claims


def ticket_claims(slug: str, ticket: store.TicketState) -> tokens.TicketClaims:
    return decode_ticket(ticket_token(slug, ticket), slug=slug)


def rank_of(ticket: store.TicketState) -> int:
    """A waiting ticket's place (0 = next)."""
    assert ticket.rank is not None, ticket
    return ticket.rank
