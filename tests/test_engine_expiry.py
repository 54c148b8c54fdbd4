"""Presence, abandonment, claim and session expiry, cleanup in bounded chunks."""

from __future__ import annotations

import pytest

from queueing import services, store
from queueing.store import TicketStatus

from .factories import access_token, join, status, status_reply, ticket_claims

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def test_an_absent_visitor_keeps_its_place_but_is_skipped_by_admission(make_queue, clock):
    queue = make_queue(state="paused", capacity=10, burst=10, presence_timeout=30, abandon_timeout=300)
    absent = join(queue.slug, "absent", now=clock())
    present = [join(queue.slug, f"p{i}", now=clock()) for i in range(2)]
    clock.advance(40)
    for ticket in present:  # they keep polling; "absent" does not
        assert status(queue.slug, ticket, now=clock()).status == TicketStatus.WAITING
    services.queue_resume(queue)
    reply = services.queue_admit(slug=queue.slug, now=clock())
    assert [a.ticket_id for a in reply.admitted] == [t.ticket_id for t in present]
    # Still first in line, and admitted as soon as it shows up again.
    back = status(queue.slug, absent, now=clock.advance(1))
    assert (back.status, back.rank) == (TicketStatus.WAITING, 0)
    assert [a.ticket_id for a in services.queue_admit(slug=queue.slug, now=clock.advance(1)).admitted] == [
        absent.ticket_id
    ]


def test_a_visitor_absent_past_the_abandon_timeout_expires_and_leaves_the_line(make_queue, clock):
    queue = make_queue(state="paused", presence_timeout=30, abandon_timeout=120)
    gone = join(queue.slug, "gone", now=clock())
    stays = join(queue.slug, "stays", now=clock())
    clock.advance(100)
    status(queue.slug, stays, now=clock())
    clock.advance(30)
    reply = services.queue_cleanup(slug=queue.slug, now=clock())
    assert reply.abandoned == [gone.ticket_id]
    assert store.line_members(queue.slug) == [stays.ticket_id]
    late = status(queue.slug, gone, now=clock())
    assert (late.status, late.reason) == (TicketStatus.EXPIRED, "abandoned")
    assert store.snapshot(queue.slug).stats["abandoned"] == "1"


def test_a_poll_after_the_abandon_timeout_reports_expired_even_before_cleanup(make_queue, clock):
    queue = make_queue(state="paused", presence_timeout=30, abandon_timeout=60)
    ticket = join(queue.slug, "late", now=clock())
    late = status(queue.slug, ticket, now=clock.advance(61))
    assert (late.status, late.reason) == (TicketStatus.EXPIRED, "abandoned")


def test_an_unclaimed_admission_frees_its_slot_after_the_claim_ttl(make_queue, clock):
    queue = make_queue(capacity=1, burst=5, claim_ttl=30)
    first = join(queue.slug, "no-show", now=clock())
    second = join(queue.slug, "next", now=clock())
    assert (first.status, second.status) == (TicketStatus.ADMITTED, TicketStatus.WAITING)
    assert services.queue_admit(slug=queue.slug, now=clock.advance(29)).admitted == []
    reply = services.queue_cleanup(slug=queue.slug, now=clock.advance(2))
    assert reply.expired_slots == [first.ticket_id]
    # Cleanup ran admission at once: the slot went to the next visitor.
    assert status(queue.slug, second, now=clock()).status == TicketStatus.ADMITTED
    assert status(queue.slug, first, now=clock()).reason == "expired_claim"


def test_the_admission_tick_also_drops_expired_slots_before_counting(make_queue, clock):
    queue = make_queue(capacity=1, burst=5, claim_ttl=10)
    first = join(queue.slug, "no-show", now=clock())
    second = join(queue.slug, "next", now=clock())
    reply = services.queue_admit(slug=queue.slug, now=clock.advance(11))
    assert reply.expired == [first.ticket_id]
    assert [a.ticket_id for a in reply.admitted] == [second.ticket_id]


def test_an_active_session_expires_at_its_hard_end(make_queue, clock):
    queue = make_queue(capacity=1, burst=5, session_ttl=100, claim_ttl=20)
    ticket = join(queue.slug, "shopper", now=clock())
    token = access_token(queue.slug, ticket)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(5)).valid
    assert services.queue_cleanup(slug=queue.slug, now=clock.advance(90)).expired_slots == []
    reply = services.queue_cleanup(slug=queue.slug, now=clock.advance(6))
    assert reply.expired_slots == [ticket.ticket_id]
    assert status(queue.slug, ticket, now=clock()).reason == "expired_session"


def test_cleanup_works_in_bounded_chunks_and_finishes(make_queue, clock, settings):
    settings.WR_CLEANUP_CHUNK = 7
    queue = make_queue(state="paused", presence_timeout=10, abandon_timeout=20)
    for i in range(30):
        join(queue.slug, f"v{i}", now=clock())
    reply = services.queue_cleanup(slug=queue.slug, now=clock.advance(30))
    assert len(reply.abandoned) == 30 and not reply.more
    assert store.snapshot(queue.slug).waiting == 0
    # A single round stops at the chunk and says there is more.
    for i in range(10):
        join(queue.slug, f"w{i}", now=clock())
    one = store.cleanup(queue.slug, now_ms=int(clock.advance(30) * 1000), chunk=7, retention_ms=1000)
    assert len(one.abandoned) == 7 and one.more


def test_finished_records_are_dropped_after_the_retention(make_queue, clock, settings):
    settings.WR_TERMINAL_RETENTION_SECONDS = 60
    queue = make_queue(state="paused")
    ticket = join(queue.slug, "leaver", now=clock())
    services.ticket_leave(slug=queue.slug, claims=ticket_claims(queue.slug, ticket), now=clock())
    assert status(queue.slug, ticket, now=clock.advance(30)).reason == "left"
    services.queue_cleanup(slug=queue.slug, now=clock.advance(31))
    assert status_reply(queue.slug, ticket, now=clock()).outcome == "gone"
    assert store.ticket_records(queue.slug) == []
