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


def stat(slug: str, name: str) -> float:
    return float(store.snapshot(slug).stats.get(name, 0) or 0)


def told(
    ahead: int, *, r_out: float, silent: float = 0.0, theta: float = 0.0, tokens: int = 0, cutting: float = 0.0
) -> int:
    """lua/_lib.lua estimate_wait, for a queue the outflow alone bounds: the t at which the admissions
    allowed by then (tokens + r_out t) reach those ahead still there when reached, and itself."""
    present = ahead * (1 - min(0.9, silent))

    def drained(n: float) -> float:
        return max(0.0, (n - tokens) / r_out)

    t = drained(present + 1)
    if theta > 0 or cutting > 0:
        cap = 2 * (present + 1)

        def admissions(t: float) -> float:
            x = theta * t
            stay = (1 - math.exp(-x)) / x if x > 1e-6 else 1.0
            return min(cap, (present + cutting * t) * stay + 1)

        lo, hi = 0.0, drained(cap)
        for _ in range(14):
            t = (lo + hi) / 2
            if drained(admissions(t)) > t:
                lo = t
            else:
                hi = t
        t = (lo + hi) / 2
    return math.ceil(t + 0.5)


def test_visitors_who_walk_away_shorten_the_waits_told_to_those_behind(make_queue, clock):
    """Half the first forty stop polling. Walking the line, admission skips them: they give the rate at
    which visitors walk away (theta, per second of waiting), the tick's look at the line finds the silent
    share, and a visitor further back is told a wait for the admissions it will really wait for, not for
    every ticket ahead of it."""
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
    theta = stat(slug, "theta")
    assert theta > 0.01  # ~20 walked away (at once) against ~20 who waited 6 to 25 s, and the prior's 100 s
    last = status(slug, later[-1], now=t0 + 25)
    ahead = last.rank or 0
    assert last.est_wait_s == told(ahead, r_out=1, silent=stat(slug, "silent"), theta=theta)
    assert last.est_wait_s < ahead  # shorter than one second for every ticket ahead


def test_walking_away_is_learnt_as_a_rate_from_the_departures_at_the_head(make_queue, clock):
    """theta = walked away ÷ seconds waited, over the departures at the head: one skipped there counts
    the time until it was last seen, one admitted its whole wait; an admission whose claim lapses was a
    walk-away too. Sums over the last ~50 departures, from a prior of five departures of 20 s each."""
    queue = make_queue(capacity=1000, outflow_per_minute=60, burst=5, presence_timeout=5, claim_ttl=10)
    slug, t0 = queue.slug, clock.now
    admitted_at_join = [join(slug, f"a{i}", now=t0) for i in range(5)]  # the bucket's five tokens
    assert all(t.status is store.TicketStatus.ADMITTED for t in admitted_at_join)
    silent = join(slug, "silent", now=t0)
    present = join(slug, "present", now=t0)
    for second in (2, 4, 6, 8):
        status(slug, present, now=t0 + second)
        status(slug, silent, now=t0 + 3) if second == 2 else None  # last seen at t0 + 3
    admit(slug, t0 + 9)  # skips the silent one (waited 3 s), admits the present one (waited 9 s)
    keep = 1 - 1 / 50
    walks, seconds = 1 * keep, 100 * keep * keep + 3 * keep + 9
    walks_seen, seconds_seen = (float(x) for x in store.snapshot(slug).stats["hz"].split())
    assert walks_seen == pytest.approx(walks, abs=1e-3)
    assert seconds_seen == pytest.approx(seconds, abs=1.01)  # whole seconds last seen
    assert stat(slug, "theta") == pytest.approx(walks_seen / seconds_seen, rel=1e-4)
    admit(slug, t0 + 20)  # the five admitted at their join never came: their claims lapse
    walks_after, _ = (float(x) for x in store.snapshot(slug).stats["hz"].split())
    assert walks_after == pytest.approx(walks_seen + 6, abs=1e-3)  # and the present one's too


def test_a_visitor_who_leaves_the_line_counts_as_walking_away(make_queue, clock):
    queue = make_queue(state="paused", capacity=1000, outflow_per_minute=60)
    t0 = clock.now
    tickets = [join(queue.slug, f"v{i}", now=t0) for i in range(3)]
    assert "hz" not in store.snapshot(queue.slug).stats
    assert services.ticket_leave(slug=queue.slug, claims=_claims(queue.slug, tickets[0]), now=t0 + 1)
    # one walk-away after a second of waiting, against the prior's 100 s (less a fiftieth)
    assert store.snapshot(queue.slug).stats["hz"] == f"{1:g} {100 * (1 - 1 / 50) + 1:.6g}"
    assert stat(queue.slug, "theta") == pytest.approx(1 / (100 * (1 - 1 / 50) + 1))


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
    # Once someone has walked away (theta > 0), those within the free slots are still told theirs: the
    # walk-aways are weighed only within what is known (seen as a script error in the engine's fuzz test)
    assert services.ticket_leave(slug=slug, claims=_claims(slug, tickets[5]), now=t0 + 2)
    assert float(store.snapshot(slug).stats["theta"]) > 0
    assert 1 <= (status(slug, tickets[2], now=t0 + 2).est_wait_s or 0) <= 3
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


def test_priority_joiners_placed_ahead_lengthen_the_wait_of_those_behind(make_queue, clock):
    """Joiners with a code go in at their level's place (level 2: the middle of the line). Those arriving
    while a visitor waits at the back are admitted before it: its estimate counts on them, at the rate
    they have been coming, for the part of its wait it spends behind their place."""
    queue = make_queue(capacity=1000, outflow_per_minute=60, burst=1)
    slug, t0 = queue.slug, clock.now
    plain = [join(slug, f"v{i}", now=t0) for i in range(41)]  # the first is admitted at its join
    told_without = status(slug, plain[-1], now=t0).est_wait_s
    assert told_without == math.ceil(40 + 0.5)
    for i in range(10):
        join(slug, f"p{i}", now=t0 + i, priority=2)
    newcomer = join(slug, "late", now=t0 + 10)
    ahead = newcomer.rank or 0
    assert ahead == 50
    # ten in the last ten seconds, an EMA over 30 s: ~0.28 a second, placed ahead for the first half
    # (1 - 0.5 * 51 / 50) of the newcomer's wait; the bucket holds the 4 tokens owed after 10 s without
    # a tick (the leader's TTL, 3 s, and one)
    rate = sum(math.exp(-(10 - i) / 30) for i in range(10)) / 30 * (1 - 0.5 * 51 / 50)
    assert newcomer.est_wait_s == told(ahead, r_out=1, tokens=4, cutting=rate)
    assert newcomer.est_wait_s > told(ahead, r_out=1, tokens=4) + 5  # without them: 48
    vip = join(slug, "vip", now=t0 + 10, priority=2)  # later ones of its level go behind it: none cut in
    assert vip.est_wait_s == math.ceil((vip.rank or 0) + 1 - 4 + 0.5)
