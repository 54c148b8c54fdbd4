"""The line around a waiting visitor (selectors.ticket_neighbours_get, lua/neighbours.lua) counts as its place
does (issue 47, item 10): the visitor's own row carries the place its status gives, whoever ahead walked away,
left or went in, and wherever priority joiners were placed."""

from __future__ import annotations

import pytest

from queueing import selectors, services, store

from .factories import join, status, ticket_claims

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def place_and_row(slug: str, ticket: store.TicketState, *, now: float) -> tuple[int | None, list[int]]:
    """The status answer's place, and the numbers of the rows around marked as the visitor's own."""
    claims = ticket_claims(slug, ticket)
    view = selectors.visitor_status_get(slug=slug, visitor_key=claims.visitor_key, seq=claims.seq, now=now)
    return view.position, [row.position for row in selectors.ticket_neighbours_get(claims=claims) if row.is_me]


def test_the_own_row_around_a_visitor_carries_the_place_its_status_gives(make_queue, clock):
    queue = make_queue(state="paused", capacity=3, burst=3, presence_timeout=10, abandon_timeout=600)
    tickets = [join(queue.slug, f"v{i}", now=clock(), priority=2 if i in (9, 14) else 0) for i in range(20)]
    walked = {0, 2, 5}  # stop polling: admission parks those it meets (0 and 2, before it has let 3 in)
    clock.advance(20)
    for i, ticket in enumerate(tickets):
        if i not in walked:
            status(queue.slug, ticket, now=clock())
    services.ticket_leave(slug=queue.slug, claims=ticket_claims(queue.slug, tickets[7]), now=clock())
    services.queue_resume(queue)
    admitted = services.queue_admit(slug=queue.slug, now=clock.advance(1)).admitted
    assert len(admitted) == 3 and {tickets[0].ticket_id, tickets[2].ticket_id} <= set(store.away_members(queue.slug))
    let_in = {a.ticket_id for a in admitted}
    checked = 0
    for i, ticket in enumerate(tickets):
        if i in walked or i == 7 or ticket.ticket_id in let_in:  # a poll would bring one who walked back
            continue
        place, own = place_and_row(queue.slug, ticket, now=clock())
        assert place is not None and own == [place], (i, place, own)
        checked += 1
    assert checked == 13
    # One who walked away comes back to its place (its poll moves those behind it): still the same count.
    back, own = place_and_row(queue.slug, tickets[2], now=clock())
    assert back is not None and own == [back]
    for ticket in (tickets[14], tickets[19]):
        place, own = place_and_row(queue.slug, ticket, now=clock())
        assert own == [place]
