"""A code entered while waiting (issue 20, item 2): the ticket moves up as a joiner of the code's level would
be placed, never back; the code's use is spent only when it moved someone; the moves told to the others
put everyone where the line says."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queueing import services, store
from queueing.models import PriorityCode, QueueShuffle
from queueing.store import TicketStatus

from .factories import join, rank_of, status, visitor

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def fill(slug: str, count: int, *, now: float, prefix: str = "w") -> list[store.TicketState]:
    return [join(slug, f"{prefix}{i}", now=now) for i in range(count)]


def promote(slug: str, ticket: store.TicketState, code: str, *, now: float) -> services.Promotion:
    return services.ticket_promote(
        slug=slug, visitor_key=ticket.ticket_id.split(".", 1)[1], seq=ticket.seq, code=code, now=now
    )


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def uses(code: str) -> int:
    return PriorityCode.objects.get(code=code).uses


@pytest.fixture
def line(make_queue, clock):
    """A paused queue (nobody is admitted) with 40 in line and a level-2 code (placed ahead of the last half)."""
    queue = make_queue(state="paused")
    PriorityCode.objects.create(queue=queue, code="GOLD-2", level=2)
    PriorityCode.objects.create(queue=queue, code="SILVER-1", level=1)
    return queue, fill(queue.slug, 40, now=clock())


def apply_moves(rank: int, ops: list[tuple[str, int, int]]) -> int:
    """A waiting page's place after a queue_move event (static/queueing/waiting.js applies them so)."""
    for op, at, count in ops:
        if op == "-" and rank > at:
            rank -= min(count, rank - at)
        elif op == "+" and rank >= at:
            rank += count
    return rank


def test_a_code_moves_a_waiting_visitor_to_where_its_level_joins_and_tells_the_others(line, clock):
    queue, tickets = line
    last = tickets[-1]
    before = {t.ticket_id: rank_of(status(queue.slug, t, now=clock())) for t in tickets[:-1]}
    seq_before = int(store.snapshot(queue.slug).stats.get("evseq", 0))
    promotion = promote(queue.slug, last, "GOLD-2", now=clock())
    assert promotion.promoted and promotion.before == 39
    assert promotion.ticket.priority == 2
    assert rank_of(promotion.ticket) == 20  # ahead of the last half, as a level-2 joiner of a line of 40
    assert status(queue.slug, last, now=clock()).rank == 20
    # Everyone else: where the moves told them to be is where the line has them.
    events = store.snapshot(queue.slug).stats
    assert int(events["evseq"]) == seq_before + 1
    members = store.line_members(queue.slug)
    assert members.index(last.ticket_id) == 20
    assert len(members) == 40
    ops = [("-", 39, 1), ("+", 20, 1)]
    for tid, rank in before.items():
        assert members.index(tid) == apply_moves(rank, ops)
    assert uses("GOLD-2") == 1


def test_one_already_ahead_of_the_levels_place_keeps_it_and_takes_the_level(line, clock):
    queue, tickets = line
    promotion = promote(queue.slug, tickets[3], "GOLD-2", now=clock())
    assert promotion.promoted and promotion.before == 3 and rank_of(promotion.ticket) == 3
    assert promotion.ticket.priority == 2
    assert store.line_members(queue.slug).index(tickets[3].ticket_id) == 3
    # A later level-2 joiner goes behind it (first come, first served within a level) even as the line empties.
    joiner = join(queue.slug, "vip", now=clock(), priority=2)
    assert rank_of(joiner) > 3


def test_the_same_level_again_changes_nothing_and_gives_the_use_back(line, clock):
    queue, tickets = line
    promote(queue.slug, tickets[35], "GOLD-2", now=clock())
    assert uses("GOLD-2") == 1
    again = promote(queue.slug, tickets[35], "GOLD-2", now=clock())
    assert not again.promoted and again.ticket.priority == 2 and rank_of(again.ticket) == 20
    lower = promote(queue.slug, tickets[35], "SILVER-1", now=clock())
    assert not lower.promoted and lower.ticket.priority == 2
    assert uses("GOLD-2") == 1 and uses("SILVER-1") == 0


def test_a_higher_code_after_a_lower_one_moves_up_again(line, clock):
    queue, tickets = line
    first = promote(queue.slug, tickets[39], "SILVER-1", now=clock())
    assert first.ticket.priority == 1 and rank_of(first.ticket) == 36  # ahead of the last tenth
    second = promote(queue.slug, tickets[39], "GOLD-2", now=clock())
    assert second.promoted and second.before == 36 and rank_of(second.ticket) == 20


def test_an_admitted_visitor_is_told_a_code_moves_only_those_in_line_and_spends_nothing(make_queue, clock):
    queue = make_queue(capacity=5)
    PriorityCode.objects.create(queue=queue, code="GOLD-2", level=2, max_uses=1)
    admitted = join(queue.slug, "first", now=clock())
    assert admitted.status == TicketStatus.ADMITTED
    with pytest.raises(services.NotInLine):
        promote(queue.slug, admitted, "GOLD-2", now=clock())
    assert uses("GOLD-2") == 0


def test_an_unknown_used_up_or_expired_code_moves_nobody(line, clock):
    queue, tickets = line
    PriorityCode.objects.create(queue=queue, code="ONCE", level=2, max_uses=1)
    promote(queue.slug, tickets[39], "ONCE", now=clock())
    for code in ("ONCE", "gold-2", "NOPE", "bad\x00code"):
        with pytest.raises(services.InvalidPriorityCode):
            promote(queue.slug, tickets[38], code, now=clock())
    assert status(queue.slug, tickets[38], now=clock()).rank == 39  # behind the one ONCE moved: one back
    assert status(queue.slug, tickets[38], now=clock()).priority == 0


def test_a_finished_or_replaced_ticket_is_not_found_and_spends_nothing(line, clock):
    queue, tickets = line
    store.leave(queue.slug, visitor_key=visitor("w5"), seq=tickets[5].seq, now_ms=int(clock() * 1000))
    with pytest.raises(services.NotInLine):
        promote(queue.slug, tickets[5], "GOLD-2", now=clock())
    stranger = store.TicketState(
        f"{tickets[6].seq + 1000:010d}.{visitor('w6')}",
        tickets[6].seq + 1000,
        TicketStatus.WAITING,
        0,
        0,
        0,
        None,
        "",
        False,
        0,
    )
    with pytest.raises(services.TicketNotFound):
        promote(queue.slug, stranger, "GOLD-2", now=clock())
    assert uses("GOLD-2") == 0


def test_a_visitor_parked_as_absent_gets_its_place_back_and_then_moves_up(make_queue, clock):
    queue = make_queue(state="paused", capacity=1, burst=1, presence_timeout=10, abandon_timeout=600)
    PriorityCode.objects.create(queue=queue, code="GOLD-2", level=2)
    tickets = [join(queue.slug, f"v{i}", now=clock()) for i in range(12)]
    clock.advance(20)
    for ticket in tickets[10:]:
        status(queue.slug, ticket, now=clock())
    services.queue_resume(queue)
    services.queue_admit(slug=queue.slug, now=clock.advance(1))  # parks v0..v9, admits v10
    assert tickets[9].ticket_id in store.away_members(queue.slug)
    promotion = promote(queue.slug, tickets[9], "GOLD-2", now=clock())
    assert promotion.promoted and promotion.ticket.priority == 2
    assert rank_of(promotion.ticket) == 0  # v11 and v9 in line: ahead of the last half, the front
    assert tickets[9].ticket_id not in store.away_members(queue.slug)
    assert store.line_members(queue.slug) == [tickets[9].ticket_id, tickets[11].ticket_id]


def test_the_pre_queue_draw_puts_a_code_holder_first_with_its_new_level(make_queue, clock):
    t0 = clock.now
    sale = make_queue(
        capacity=1, presence_timeout=600, abandon_timeout=3600, prequeue_opens_at=at(t0 + 60), starts_at=at(t0 + 120)
    )
    PriorityCode.objects.create(queue=sale, code="GOLD-2", level=2)
    tickets = [join(sale.slug, f"n{i}", now=t0 + 61) for i in range(8)]
    promote(sale.slug, tickets[7], "GOLD-2", now=t0 + 62)
    services.queue_tick(slug=sale.slug, now=t0 + 121)
    record = QueueShuffle.objects.get(queue=sale)
    assert record.order[0] == tickets[7].seq
    assert [level for _, level in sorted(record.tickets)] == [0] * 7 + [2]
