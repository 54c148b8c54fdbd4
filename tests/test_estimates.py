"""Wait estimates (issue 18), in the engine with a controlled clock: the line drains from its head, where
visitors who stopped polling are skipped at no cost, so those found gone there shorten the estimates of
everyone behind; the outflow and the site's capacity both bound the admissions to come; and each estimate
comes with the range the queue's own record of told-versus-had gives it. Whole sales over HTTP:
tests/e2e/test_estimates.py and bench/estimate_sim.py."""

from __future__ import annotations

import math

import pytest

from queueing import services, store, tokens

from .factories import access_claims, join, status

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster


def admit(slug: str, now: float) -> list[store.Admission]:
    return services.queue_admit(slug=slug, now=now).admitted


def gone_share(slug: str) -> float:
    return float(store.snapshot(slug).stats.get("gone", 0))


def test_visitors_found_gone_at_the_head_shorten_the_waits_told_to_those_behind(make_queue, clock):
    """Half the first forty stop polling. Walking the line, admission skips them: the share of departures
    found gone rises, and a visitor further back is told a wait for the admissions it will really wait for,
    not for every ticket ahead of it."""
    queue = make_queue(capacity=1000, outflow_per_minute=60, burst=1, presence_timeout=5)
    slug, t0 = queue.slug, clock.now
    first = [join(slug, f"v{i}", now=t0) for i in range(40)]  # the first takes the bucket's token
    later = [join(slug, f"w{i}", now=t0) for i in range(60)]
    told_before = status(slug, later[-1], now=t0).est_wait_s
    assert told_before == math.ceil(99 / 1 + 0.5)  # 98 ahead, then itself, at 1 a second
    for second in range(1, 21):
        now = t0 + 5 + second
        for index, ticket in enumerate(first + later):
            if index % 2 == 0 or index >= 40:  # the odd ones of the first forty have gone silent
                status(slug, ticket, now=now)
        admit(slug, now)
    share = gone_share(slug)
    assert 0.2 < share < 0.5  # 19 or 20 skipped of ~40 departures, in an average over the last 50
    last = status(slug, later[-1], now=t0 + 25)
    ahead = last.rank or 0
    assert last.est_wait_s == math.ceil((ahead * (1 - share) + 1) / 1 + 0.5)
    assert last.est_wait_s < ahead  # shorter than one second for every ticket ahead


def test_a_visitor_who_leaves_the_line_counts_as_gone_for_those_behind(make_queue, clock):
    queue = make_queue(state="paused", capacity=1000, outflow_per_minute=60)
    t0 = clock.now
    tickets = [join(queue.slug, f"v{i}", now=t0) for i in range(3)]
    assert gone_share(queue.slug) == 0
    assert services.ticket_leave(slug=queue.slug, claims=_claims(queue.slug, tickets[0]), now=t0 + 1)
    assert gone_share(queue.slug) == pytest.approx(1 / 50)


def _claims(slug: str, ticket: store.TicketState) -> tokens.TicketClaims:
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    return tokens.TicketClaims(
        slug=slug, ticket_id=ticket.ticket_id, seq=parsed[0], visitor_key=parsed[1], priority=0, epoch=1
    )


def test_once_every_slot_is_taken_the_site_s_pace_bounds_the_wait(make_queue, clock):
    """Two slots, sessions of 20 s: past the free slots, a slot frees every 10 s, however fast the outflow."""
    queue = make_queue(capacity=2, outflow_per_minute=600, burst=10, session_ttl=3600)
    slug, t0 = queue.slug, clock.now
    # Teach the queue how long a slot is held: two sessions of 20 s each.
    for name in ("a", "b"):
        ticket = join(slug, name, now=t0)
        assert ticket.status is store.TicketStatus.ADMITTED
    for name in ("a", "b"):
        ticket = status(slug, join(slug, name, now=t0), now=t0)
        services.session_complete(slug=slug, claims=access_claims(slug, ticket), now=t0 + 20)
    line = [join(slug, f"v{i}", now=t0 + 21) for i in range(10)]  # two admitted at once, eight wait
    service_s = float(store.snapshot(slug).stats["ema_service_ms"]) / 1000
    assert service_s == pytest.approx(20, abs=0.01)
    last = status(slug, line[-1], now=t0 + 21)
    assert last.rank == 7
    # 8 admissions (7 ahead and itself), no slot free, one freed every 20 / 2 = 10 s.
    assert last.est_wait_s == math.ceil(8 * service_s / 2 + 0.5)


def test_free_slots_are_filled_at_the_outflow_then_the_site_s_pace_takes_over(make_queue, clock):
    """Ten free slots at 30 a minute: the first ten ahead go at the outflow, the rest as slots free."""
    queue = make_queue(capacity=10, outflow_per_minute=30, burst=1, session_ttl=3600)
    slug, t0 = queue.slug, clock.now
    ticket = join(slug, "teacher", now=t0)  # takes the token and a slot
    services.session_complete(slug=slug, claims=access_claims(slug, ticket), now=t0 + 100)  # held 100 s
    tickets = [join(slug, f"v{i}", now=t0 + 100) for i in range(30)]  # the first ones take the tokens
    snap = store.snapshot(slug)
    free = 10 - snap.admitted - snap.active
    near, far = status(slug, tickets[4], now=t0 + 100), status(slug, tickets[29], now=t0 + 100)
    assert near.rank is not None and far.rank is not None and free > near.rank + 1
    # near: fewer admissions than free slots: the outflow alone (one every 2 s; the bucket is spent)
    assert near.est_wait_s == math.ceil((near.rank + 1) / 0.5 + 0.5)
    # far: the free slots go at the outflow, the rest as slots free, one every 100 s / 10
    assert far.est_wait_s == math.ceil((far.rank + 1 - free) / (10 / 100) + 0.5)
    assert far.est_wait_s > math.ceil((far.rank + 1) / 0.5 + 0.5)  # longer than the outflow alone says


def test_until_a_slot_comes_back_the_wait_of_those_who_need_one_is_unknown(make_queue, clock):
    """Three slots, nobody has finished a session yet: how long sessions last is not known, so neither is
    the wait of a visitor who needs more slots than are free; those within the free slots are told theirs."""
    queue = make_queue(capacity=3, outflow_per_minute=60, burst=1, session_ttl=3600)
    slug, t0 = queue.slug, clock.now
    tickets = [join(slug, f"v{i}", now=t0) for i in range(6)]  # the first is admitted: 2 slots free
    assert [t.est_wait_s for t in tickets[1:]] == [math.ceil(1 + 0.5), math.ceil(2 + 0.5), None, None, None]
    services.session_complete(slug=slug, claims=access_claims(slug, tickets[0]), now=t0 + 30)  # one came back
    assert status(slug, tickets[5], now=t0 + 30).est_wait_s is not None


def test_waits_through_a_pause_teach_the_estimate_nothing(make_queue, clock):
    """Visitors who joined before a pause waited longer than told, but no estimate could foresee the
    pause: their waits do not widen the estimate's range."""
    queue = make_queue(capacity=1000, outflow_per_minute=60, burst=1, presence_timeout=3600, abandon_timeout=7200)
    slug, t0 = queue.slug, clock.now
    for i in range(20):
        join(slug, f"v{i}", now=t0)
    services.queue_update(queue, changes={"state": "paused"}, actor_label="tests")
    admit(slug, t0 + 5)
    services.queue_update(queue, changes={"state": "open"}, actor_label="tests")
    for second in range(60, 80):  # admitted a minute later than told
        admit(slug, t0 + second)
    stats = store.snapshot(slug).stats
    assert int(stats["admitted"]) >= 15 and float(stats["opened_ms"]) == pytest.approx((t0 + 60) * 1000, abs=1)
    assert "w_lo" not in stats and "w_hi" not in stats


def test_the_range_starts_wide_and_narrows_to_the_queue_s_record(make_queue, clock):
    queue = make_queue(capacity=1000, outflow_per_minute=60, burst=1, presence_timeout=3600, abandon_timeout=7200)
    slug, t0 = queue.slug, clock.now
    tickets = [join(slug, f"v{i}", now=t0) for i in range(120)]
    first = _poll_figures(slug, tickets[50], t0)
    est = tickets[50].est_wait_s
    assert est is not None
    assert first.wait_range(est) == [math.floor(est * 0.7), math.ceil(est * 1.4)]  # no record yet
    # Admitted exactly when told (one a second, as the estimate said): the range closes in on the estimate.
    for second in range(1, 100):
        admit(slug, t0 + second)
    low, high = _poll_figures(slug, tickets[110], t0 + 100).wait_range(100)  # type: ignore[misc]
    assert 70 < low <= 100 <= high < 140
    assert high - low < 70 * 0.5  # narrower than the first range (70 .. 140)


def _poll_figures(slug: str, ticket: store.TicketState, now: float) -> store.PollFigures:
    """The figures a poll reads (they carry the range's bounds)."""
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    reply = store.status(slug, visitor_key=parsed[1], seq=ticket.seq, now_ms=int(now * 1000))
    assert isinstance(reply.figures, store.PollFigures)
    return reply.figures
