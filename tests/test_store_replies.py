"""Every Lua script's reply against the parser that names its fields (queueing/store/*.py): the real script
runs on the real Redis of the test settings, after the product was driven into a known state, and the
parsed fields must be the ones the script's header lists, with the values the state implies."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, cast

import msgpack
import pytest

from queueing import models, services, store
from queueing.models import Queue
from queueing.store import TicketStatus
from queueing.store.connection import raw_client, run

from .factories import join, visitor
from .test_adaptive import ADAPTIVE

T0_MS = 1_800_000_000_000  # a boundary of every limiter window used here (a multiple of 10 s)
NO_RESTORE_ARGS = (0, 0, "", 0)  # status.lua ARGV[4..7] of a ticket with nothing to restore


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def keys(slug: str) -> list[str]:
    return store.queue_keys(slug).script_keys()


def join_raw(slug: str, name: str, *, now_ms: int, priority: int = 0, display_name: str = "") -> Any:
    """join.lua as store.join calls it (no address cap, no proof of work)."""
    qk = store.queue_keys(slug)
    all_keys = [*qk.script_keys(), qk.tagged("addr:"), qk.tagged("pow:")]
    return run("join", all_keys, (visitor(name), now_ms, priority, display_name, 0, 0, 0))


def status_raw(slug: str, name: str, seq: int, *, now_ms: int) -> Any:
    return run("status", keys(slug), (visitor(name), seq, now_ms, *NO_RESTORE_ARGS))


def evseq(slug: str) -> int:
    return int(cast(str | None, store.client().hget(store.queue_keys(slug).st, "evseq")) or 0)


def wait_lines(slug: str) -> list[str]:
    """The wait samples the admissions left (admit.lua RPUSHes one per admission)."""
    return cast(list[str], store.client().lrange(store.queue_keys(slug).waits, 0, -1))


def epoch_of(queue: Queue) -> int:
    return Queue.objects.get(pk=queue.pk).epoch


def refuses_a_missing_and_an_extra_field(parse: Any, raw: list[Any]) -> None:
    """A parser with a fixed layout takes exactly the reply it was written for."""
    assert len(raw) > 1
    with pytest.raises(ValueError):
        parse([*raw, "extra"])
    with pytest.raises(ValueError):
        parse(raw[:-1])


# --- join.lua, status.lua: TicketReply, TicketState, QueueFigures, Moves --------------------------------


def test_it_parses_a_join_into_a_created_waiting_ticket_at_the_head_with_the_queues_figures(make_queue, clock):
    queue = make_queue(
        state="paused",
        name="Shoe sale",
        target_url="https://shop.example/sale",
        capacity=7,
        outflow_per_minute=90.0,
        presence_timeout=45,
        claim_ttl=75,
    )
    now_ms = ms(clock.now)

    raw = join_raw(queue.slug, "ada", now_ms=now_ms, display_name="Ada")
    reply = store.TicketReply.parse(raw)

    assert reply.outcome == "created"
    ticket = reply.ticket
    assert ticket is not None
    assert ticket.ticket_id == store.ticket_id(ticket.seq, visitor("ada"))
    assert ticket.seq == 1 and isinstance(ticket.seq, int)  # the first number of a new queue
    assert ticket.status is TicketStatus.WAITING
    assert ticket.rank == 0
    assert (ticket.fence, ticket.expires_ms) == (0, 0)  # nothing until admitted
    assert ticket.est_wait_s is None  # paused: no estimate (-1 in the reply)
    assert ticket.reason == ""
    assert ticket.freed is False
    assert ticket.priority == 0
    assert ticket.score == 1.0 and isinstance(ticket.score, float)  # level 0: its sequence number

    figures = reply.figures
    assert figures is not None
    assert figures.state == "paused"
    assert figures.capacity == 7 and figures.used == 0 and figures.free == 7
    assert figures.outflow_per_minute == 90.0 and isinstance(figures.outflow_per_minute, float)
    assert figures.admitted_total == 0
    assert figures.waiting == 1
    assert figures.away == 0
    assert figures.presence_timeout_s == 45
    assert figures.claim_ttl_s == 75
    assert figures.target_url == "https://shop.example/sale"
    assert figures.name == "Shoe sale"
    assert figures.epoch == epoch_of(queue)
    assert figures.starts_at_ms == 0
    assert figures.evseq == 0

    assert reply.moves == store.Moves(0, [])  # first in an empty line: nobody moved
    # The layout the header gives: {outcome, ticket (11 fields), figures (20 fields), moves}.
    assert len(raw) == 4 and len(raw[1]) == 11 and len(raw[2]) == len(dataclasses.fields(store.QueueFigures)) == 20
    assert figures.held_gone_until_ms == 0  # no slot held by a visitor who left


def test_it_parses_a_second_join_of_the_same_visitor_as_the_existing_ticket(make_queue, clock):
    queue = make_queue(state="paused")
    first = store.TicketReply.parse(join_raw(queue.slug, "ada", now_ms=ms(clock.now))).ticket
    join(queue.slug, "bob", now=clock.now)

    again = store.TicketReply.parse(join_raw(queue.slug, "ada", now_ms=ms(clock.advance(3))))

    assert again.outcome == "existing"
    assert again.ticket is not None and first is not None
    assert again.ticket.ticket_id == first.ticket_id
    assert again.ticket.rank == 0
    assert again.ticket.score == first.score
    assert again.figures is not None and again.figures.waiting == 2


def test_it_parses_a_join_admitted_at_once_as_a_ticket_with_a_fence_and_no_line_score(make_queue, clock):
    queue = make_queue(capacity=3, session_ttl=600)
    now_ms = ms(clock.now)

    raw = join_raw(queue.slug, "ada", now_ms=now_ms)
    reply = store.TicketReply.parse(raw)

    assert reply.outcome == "created"
    ticket = reply.ticket
    assert ticket is not None
    assert ticket.status is TicketStatus.ADMITTED
    assert ticket.rank is None  # not in line (-1 in the reply)
    assert ticket.fence == 1
    assert ticket.expires_ms == now_ms + 600_000
    assert ticket.score is None  # the reply leaves the line score out
    assert len(raw[1]) == 10
    assert reply.figures is not None
    assert (reply.figures.state, reply.figures.used, reply.figures.admitted_total) == ("open", 1, 1)
    assert reply.figures.waiting == 0


def test_it_parses_a_status_poll_into_the_tickets_place_and_wait_estimate(make_queue, clock):
    # One slot, taken by the first joiner: until a slot has come back once, nobody knows how long sessions
    # last, so the wait of a visitor who needs a slot is unknown (-1 in the reply; lua/_estimates.lua estimate_wait).
    queue = make_queue(capacity=1, outflow_per_minute=30.0)
    t0 = clock.now
    join(queue.slug, "ada", now=t0)
    join(queue.slug, "bob", now=t0)
    cy = join(queue.slug, "cy", now=t0)

    raw = status_raw(queue.slug, "cy", cy.seq, now_ms=ms(t0 + 1))
    reply = store.StatusReply.parse(raw)

    assert reply.outcome == "ok"
    assert reply.ticket is not None
    assert reply.ticket.ticket_id == cy.ticket_id
    assert reply.ticket.status is TicketStatus.WAITING
    assert reply.ticket.rank == 1
    assert reply.ticket.est_wait_s is None
    assert reply.ticket.score is None  # a poll's ticket has no line score
    assert len(raw[1]) == 10
    assert reply.figures is not None
    assert (reply.figures.used, reply.figures.waiting, reply.figures.capacity) == (1, 2, 1)
    assert reply.moves == store.NO_MOVES


def test_it_parses_a_poll_of_a_finished_ticket_with_its_reason(make_queue, clock):
    queue = make_queue(state="paused")
    ada = join(queue.slug, "ada", now=clock.now)
    store.leave(queue.slug, visitor_key=visitor("ada"), seq=ada.seq, now_ms=ms(clock.advance(1)))

    reply = store.StatusReply.parse(status_raw(queue.slug, "ada", ada.seq, now_ms=ms(clock.advance(1))))

    assert reply.outcome == "ok"
    assert reply.ticket is not None
    assert reply.ticket.status is TicketStatus.EXPIRED
    assert reply.ticket.reason == "left"
    assert reply.ticket.rank is None


def test_it_parses_a_poll_of_an_unknown_ticket_as_gone_without_a_ticket(make_queue, clock):
    queue = make_queue(state="paused", capacity=4)
    reply = store.StatusReply.parse(status_raw(queue.slug, "nobody", 42, now_ms=ms(clock.now)))
    assert reply.outcome == "gone"
    assert reply.ticket is None
    assert reply.figures is None  # nobody reads them: the API answers `expired`
    assert reply.moves == store.NO_MOVES


def test_it_parses_a_join_of_a_queue_redis_knows_nothing_of_as_no_config_without_figures(db, clock):
    slug = f"unknown-{uuid.uuid4().hex[:8]}"
    reply = store.TicketReply.parse(join_raw(slug, "ada", now_ms=ms(clock.now)))
    assert reply.outcome == "no_config"
    assert reply.ticket is None
    assert reply.figures is None
    assert reply.moves == store.NO_MOVES


def test_it_parses_the_move_of_a_premium_joiner_placed_ahead_of_the_line(make_queue, clock):
    queue = make_queue(state="paused")
    ada = join(queue.slug, "ada", now=clock.now)
    join(queue.slug, "bob", now=clock.now)
    seq_before = evseq(queue.slug)

    reply = store.TicketReply.parse(join_raw(queue.slug, "vip", now_ms=ms(clock.now), priority=3))

    assert reply.moves == store.Moves(seq_before + 1, [("+", 0, 1)])  # placed at the head, two pushed back
    assert isinstance(reply.moves.ops[0][1], int) and isinstance(reply.moves.seq, int)
    assert reply.ticket is not None
    assert (reply.ticket.rank, reply.ticket.priority) == (0, 3)
    assert reply.ticket.score is not None and ada.score is not None and reply.ticket.score < ada.score
    assert reply.figures is not None and reply.figures.evseq == seq_before + 1


def test_it_refuses_a_ticket_reply_with_a_field_too_many_or_too_few(make_queue, clock):
    queue = make_queue(state="paused")
    raw = join_raw(queue.slug, "ada", now_ms=ms(clock.now))
    _, ticket, figures, moves = raw

    refuses_a_missing_and_an_extra_field(store.QueueFigures.parse, figures)
    assert moves == 0 and store.Moves.parse(moves) == store.NO_MOVES  # nobody moved: 0, not two tables
    refuses_a_missing_and_an_extra_field(store.Moves.parse, [4, [["+", 0, 1]]])
    refuses_a_missing_and_an_extra_field(store.TicketReply.parse, raw)
    with pytest.raises(ValueError):
        store.TicketState.parse([*ticket, "extra"])
    # The line score is optional (a poll leaves it out); any other field missing is refused.
    assert store.TicketState.parse(ticket[:10]).score is None
    with pytest.raises(ValueError):
        store.TicketState.parse(ticket[:9])


# --- leave.lua, revoke.lua: ChangeReply ------------------------------------------------------------------


def test_it_parses_a_waiting_visitors_leave_with_the_place_it_left(make_queue, clock):
    queue = make_queue(state="paused")
    join(queue.slug, "ada", now=clock.now)
    bob = join(queue.slug, "bob", now=clock.now)
    join(queue.slug, "cy", now=clock.now)
    seq_before = evseq(queue.slug)

    raw = run("leave", keys(queue.slug), (visitor("bob"), bob.seq, ms(clock.advance(1))))
    reply = store.ChangeReply.parse(raw)

    assert tuple(reply) == ("left", False, store.Moves(seq_before + 1, [("-", 1, 1)]))
    assert reply.freed is False and isinstance(reply.freed, bool)
    again = store.ChangeReply.parse(run("leave", keys(queue.slug), (visitor("bob"), bob.seq, ms(clock.now))))
    assert (again.result, again.freed, again.moves) == ("gone", False, store.NO_MOVES)
    refuses_a_missing_and_an_extra_field(store.ChangeReply.parse, raw)


def test_it_parses_the_revocation_of_an_admitted_ticket_as_freeing_its_slot(make_queue, clock):
    queue = make_queue(capacity=2)
    ada = join(queue.slug, "ada", now=clock.now)
    assert ada.status is TicketStatus.ADMITTED

    reply = store.ChangeReply.parse(run("revoke", keys(queue.slug), (ada.ticket_id, ms(clock.advance(1)))))

    assert (reply.result, reply.freed) == ("revoked", True)
    assert reply.moves == store.NO_MOVES  # it held a slot, not a place in line
    again = store.ChangeReply.parse(run("revoke", keys(queue.slug), (ada.ticket_id, ms(clock.now))))
    assert (again.result, again.freed) == ("already", False)
    unknown = store.ChangeReply.parse(run("revoke", keys(queue.slug), (store.ticket_id(99, "nobody"), ms(clock.now))))
    assert unknown.result == "not_found"


# --- neighbours.lua: Neighbour ---------------------------------------------------------------------------


def test_it_parses_the_visitors_around_one_in_line_order_with_names_and_levels(make_queue, clock):
    queue = make_queue(state="paused")
    join(queue.slug, "ada", now=clock.now, priority=2, display_name="Ada")  # first: the head, level 2
    bob = join(queue.slug, "bob", now=clock.now, display_name="Bob")
    join(queue.slug, "cy", now=clock.now, display_name="Cy")
    join(queue.slug, "dee", now=clock.now, display_name="Dee")

    rank, rows = run("neighbours", keys(queue.slug), (visitor("bob"), bob.seq, 1, 1, int(clock.now * 1000)))

    assert rank == 1
    assert [store.Neighbour.parse(row) for row in rows] == [
        store.Neighbour(0, "Ada", False, 2),
        store.Neighbour(1, "Bob", True, 0),
        store.Neighbour(2, "Cy", False, 0),
    ]
    assert store.Neighbour.parse(rows[1]).is_me is True
    refuses_a_missing_and_an_extra_field(store.Neighbour.parse, rows[0])


# --- session_start.lua, complete.lua: SessionReply, ChangeReply ------------------------------------------


def test_it_parses_a_session_start_with_the_sessions_end(make_queue, clock):
    queue = make_queue(capacity=2, session_ttl=900)
    admitted_at = clock.now
    ada = join(queue.slug, "ada", now=admitted_at)
    epoch = epoch_of(queue)
    args = (visitor("ada"), ada.seq, ada.fence, ms(clock.advance(2)), epoch, ada.expires_ms)

    session_keys = [*keys(queue.slug), store.queue_keys(queue.slug).tagged(f"bind:{visitor('ada')}")]
    raw = run("session_start", session_keys, args)
    reply = store.SessionReply.parse(raw)

    assert tuple(reply) == ("valid", ms(admitted_at) + 900_000, False)
    assert reply.expires_ms == ada.expires_ms
    stale = (visitor("ada"), ada.seq, ada.fence + 5, ms(clock.now), epoch, ada.expires_ms)
    assert tuple(store.SessionReply.parse(run("session_start", session_keys, stale))) == ("superseded", 0, False)
    refuses_a_missing_and_an_extra_field(store.SessionReply.parse, raw)


def test_it_parses_a_completion_as_freeing_the_slot_once(make_queue, clock):
    queue = make_queue(capacity=2)
    ada = join(queue.slug, "ada", now=clock.now)
    args = (visitor("ada"), ada.seq, ada.fence, ms(clock.advance(5)))

    raw = run("complete", keys(queue.slug), args)

    assert tuple(store.ChangeReply.parse(raw)) == ("completed", True, store.NO_MOVES)
    assert tuple(store.ChangeReply.parse(run("complete", keys(queue.slug), args))) == ("already", False, store.NO_MOVES)
    refuses_a_missing_and_an_extra_field(store.ChangeReply.parse, raw)


# --- admit.lua: AdmitReply, Admission; the wait samples it leaves: WaitSample ----------------------------


def test_it_parses_an_admission_with_the_tickets_it_admitted_in_line_order(make_queue, clock):
    # One slot, taken at once by the first joiner: the next two in line were told no wait at their joins
    # (unknown until a slot comes back, as above).
    queue = make_queue(capacity=1, outflow_per_minute=30.0, session_ttl=600)
    t0 = clock.now
    join(queue.slug, "ada", now=t0)
    bob = join(queue.slug, "bob", now=t0 + 1)
    cy = join(queue.slug, "cy", now=t0 + 2)
    assert (bob.est_wait_s, cy.est_wait_s) == (None, None)
    services.queue_update(queue, changes={"capacity": 3}, actor_label="tests")
    seq_before = evseq(queue.slug)
    now_ms = ms(t0 + 5)

    raw = run("admit", keys(queue.slug), (now_ms, "", 10, 40))
    reply = store.AdmitReply.parse(raw)

    assert reply.outcome == "ok"
    assert reply.admitted == [
        store.Admission(bob.ticket_id, 2, now_ms + 600_000, ms(t0 + 1), None),
        store.Admission(cy.ticket_id, 3, now_ms + 600_000, ms(t0 + 2), None),
    ]
    assert reply.expired == []
    assert reply.figures is not None
    assert (reply.figures.capacity, reply.figures.used, reply.figures.waiting) == (3, 3, 0)
    assert reply.figures.admitted_total == 3
    assert reply.moves == store.Moves(seq_before + 1, [("-", 0, 2)])  # both left from the head
    refuses_a_missing_and_an_extra_field(store.AdmitReply.parse, raw)
    refuses_a_missing_and_an_extra_field(store.Admission.parse, raw[1][0])


def test_it_parses_an_admission_that_expired_an_unclaimed_ticket_first(make_queue, clock):
    queue = make_queue(capacity=1, claim_ttl=60, presence_timeout=3600, abandon_timeout=7200)
    t0 = clock.now
    ada = join(queue.slug, "ada", now=t0)
    bob = join(queue.slug, "bob", now=t0)

    reply = store.AdmitReply.parse(run("admit", keys(queue.slug), (ms(t0 + 61), "", 10, 40)))

    assert reply.expired == [ada.ticket_id]
    assert [a.ticket_id for a in reply.admitted] == [bob.ticket_id]
    assert reply.admitted[0].fence == 2


def test_it_parses_an_admission_of_a_paused_queues_visitor_as_having_no_estimate(make_queue, clock):
    queue = make_queue(state="paused")
    ada = join(queue.slug, "ada", now=clock.now)
    services.queue_resume(queue, actor_label="tests")

    reply = store.AdmitReply.parse(run("admit", keys(queue.slug), (ms(clock.advance(3)), "", 10, 40)))

    assert [a.ticket_id for a in reply.admitted] == [ada.ticket_id]
    assert reply.admitted[0].est_wait_at_join_s is None  # -1: nothing was promised at join


def test_it_parses_an_admission_tick_with_a_stale_leader_token_as_not_leader(make_queue, clock):
    queue = make_queue(state="paused")
    join(queue.slug, "ada", now=clock.now)
    token = store.leader(queue.slug, instance_id="node-a", ttl_ms=30_000)
    assert token is not None

    reply = store.AdmitReply.parse(run("admit", keys(queue.slug), (ms(clock.now), "node-a:0", 10, 40)))

    assert (reply.outcome, reply.admitted, reply.expired, reply.figures) == ("not_leader", [], [], None)
    assert reply.moves == store.NO_MOVES


def test_it_parses_the_wait_samples_an_admission_leaves(make_queue, clock):
    queue = make_queue(capacity=3, outflow_per_minute=30.0, burst=1)
    t0 = clock.now
    join(queue.slug, "ada", now=t0)  # admitted at once, with the bucket's one token
    cy_joined = t0 + 1
    join(queue.slug, "bob", now=cy_joined)
    cy = join(queue.slug, "cy", now=cy_joined)
    assert cy.est_wait_s == 5  # two admissions at one every 2 s (slots are free), and half a tick
    run("admit", keys(queue.slug), (ms(t0 + 9), "", 10, 40))

    lines = wait_lines(queue.slug)
    samples = [store.WaitSample.parse(line) for line in lines]

    assert len(samples) == 3
    assert samples[2] == store.WaitSample(cy.ticket_id, ms(cy_joined), ms(t0 + 9), 5)
    assert samples[0].admitted_ms == samples[0].joined_ms == ms(t0)
    assert samples[2].raw == lines[2]
    assert not samples[2].stopped and store.WaitSample.parse(f"{samples[2].raw} stopped").stopped
    with pytest.raises(ValueError):
        store.WaitSample.parse(f"{samples[2].raw} extra")
    with pytest.raises(ValueError):
        store.WaitSample.parse(samples[2].raw.rsplit(" ", 1)[0])


def test_it_parses_a_wait_sample_of_a_visitor_told_nothing_at_join_as_no_estimate(make_queue, clock):
    queue = make_queue(state="paused")
    join(queue.slug, "ada", now=clock.now)
    services.queue_resume(queue, actor_label="tests")
    run("admit", keys(queue.slug), (ms(clock.advance(3)), "", 10, 40))

    (line,) = wait_lines(queue.slug)

    assert store.WaitSample.parse(line).estimated_s is None


# --- cleanup.lua: CleanupReply ---------------------------------------------------------------------------


def test_it_parses_a_cleanup_round_with_what_it_expired_and_abandoned(make_queue, clock):
    queue = make_queue(capacity=1, claim_ttl=60, presence_timeout=60, abandon_timeout=300)
    t0 = clock.now
    ada = join(queue.slug, "ada", now=t0)  # admitted at once, never claimed
    bob = join(queue.slug, "bob", now=t0)  # waits, and is never seen again
    seq_before = evseq(queue.slug)
    hour_ms = 3_600_000

    raw = run("cleanup", keys(queue.slug), (ms(t0 + 400), 100, hour_ms))
    reply = store.CleanupReply.parse(raw)

    assert reply.expired_slots == [ada.ticket_id]
    assert reply.abandoned == [bob.ticket_id]
    assert reply.pruned == 0  # both just finished: kept for the retention
    assert reply.more is False
    assert reply.moves == [store.Moves(seq_before + 1, [("-", 0, 1)])]

    later = store.CleanupReply.parse(run("cleanup", keys(queue.slug), (ms(t0 + 400) + hour_ms + 1, 100, hour_ms)))
    assert (later.expired_slots, later.abandoned, later.pruned, later.more, later.moves) == ([], [], 2, False, [])
    refuses_a_missing_and_an_extra_field(store.CleanupReply.parse, raw)


def test_it_parses_a_cleanup_round_stopped_at_its_chunk_as_more_to_do(make_queue, clock):
    queue = make_queue(capacity=2, claim_ttl=60)
    t0 = clock.now
    join(queue.slug, "ada", now=t0)
    join(queue.slug, "bob", now=t0)

    reply = store.CleanupReply.parse(run("cleanup", keys(queue.slug), (ms(t0 + 61), 1, 3_600_000)))

    assert len(reply.expired_slots) == 1
    assert reply.more is True


# --- capacity.lua: CapacityReply -------------------------------------------------------------------------


def test_it_parses_a_capacity_report_with_the_reported_use_and_the_source(make_queue, clock):
    queue = make_queue(capacity=12, capacity_source="reported")

    raw = run("capacity", keys(queue.slug), (5, ms(clock.now)))
    reply = store.CapacityReply.parse(raw)

    assert tuple(reply) == (12, 5, "reported")
    assert reply is not None and isinstance(reply.capacity, int) and isinstance(reply.used, int)
    refuses_a_missing_and_an_extra_field(store.CapacityReply.parse, raw)


def test_it_parses_a_capacity_report_for_a_queue_without_a_policy_as_none(db, clock):
    slug = f"unknown-{uuid.uuid4().hex[:8]}"
    raw = run("capacity", keys(slug), (5, ms(clock.now)))
    assert raw == []  # capacity.lua: {} without a policy
    assert store.capacity_report(slug, in_use=5, now_ms=ms(clock.now)) is None
    with pytest.raises(ValueError):
        store.CapacityReply.parse(raw)


# --- prequeue.lua: PrequeueEntry -------------------------------------------------------------------------


def test_it_parses_the_prequeue_as_the_tickets_that_joined_before_a_moment_in_line_order(make_queue, clock):
    queue = make_queue(state="paused")
    t0 = clock.now
    ada = join(queue.slug, "ada", now=t0, priority=2)
    bob = join(queue.slug, "bob", now=t0 + 1)
    join(queue.slug, "cy", now=t0 + 5)

    rows = run("prequeue", keys(queue.slug), (ms(t0 + 5),))
    entries = [store.PrequeueEntry.parse(row) for row in rows]

    assert [tuple(entry) for entry in entries] == [(ada.ticket_id, ada.seq, 2), (bob.ticket_id, bob.seq, 0)]
    assert all(isinstance(entry.seq, int) for entry in entries)
    refuses_a_missing_and_an_extra_field(store.PrequeueEntry.parse, rows[0])


# --- outflow_adapt.lua: OutflowAdaptReply ----------------------------------------------------------------


def test_it_parses_an_outflow_step_with_the_rate_before_and_after(make_queue, clock):
    queue = make_queue(**ADAPTIVE)
    token = store.leader(queue.slug, instance_id="node-a", ttl_ms=30_000)
    assert token is not None
    now_ms = ms(clock.now)

    raw = run("outflow_adapt", keys(queue.slug), (now_ms, token, "decrease"))
    reply = store.OutflowAdaptReply.parse(raw)

    assert tuple(reply) == ("adapted", 60.0, 30.0)  # 60 x 0.5
    assert isinstance(reply.before, float) and isinstance(reply.after, float)
    again = store.OutflowAdaptReply.parse(run("outflow_adapt", keys(queue.slug), (now_ms + 1000, token, "decrease")))
    assert tuple(again) == ("not_due", 30.0, 30.0)
    stale = store.OutflowAdaptReply.parse(run("outflow_adapt", keys(queue.slug), (now_ms, "node-b:9", "decrease")))
    assert stale.outcome == "not_leader"
    refuses_a_missing_and_an_extra_field(store.OutflowAdaptReply.parse, raw)


def test_it_parses_an_outflow_step_of_a_queue_not_adapting_as_off(make_queue, clock):
    queue = make_queue(outflow_per_minute=45.0)
    token = store.leader(queue.slug, instance_id="node-a", ttl_ms=30_000)
    assert token is not None
    reply = store.OutflowAdaptReply.parse(run("outflow_adapt", keys(queue.slug), (ms(clock.now), token, "increase")))
    assert tuple(reply) == ("off", 45.0, 45.0)


# --- ticket records (lua/_lib.lua save()): TicketRecord --------------------------------------------------


def record(slug: str, name: str) -> list[Any]:
    """A ticket's record as the scripts packed it (msgpack, read as bytes)."""
    bytes_client = raw_client()
    keys, vk = store.queue_keys(slug), visitor(name)
    packed = bytes_client.hget(*keys.record(vk)) or bytes_client.hget(keys.tk, vk)  # waiting, or any other
    assert packed is not None
    return list(msgpack.unpackb(packed, raw=False))


def test_it_parses_a_waiting_tickets_record(make_queue, clock):
    queue = make_queue(state="paused")
    joined_ms = ms(clock.now) + 250  # not a whole second: seen_s is rounded down
    store.TicketReply.parse(join_raw(queue.slug, "ada", now_ms=joined_ms, priority=1, display_name="Ada"))

    parsed = store.TicketRecord.parse(visitor("ada"), record(queue.slug, "ada"))

    assert parsed.visitor_key == visitor("ada")
    assert parsed.seq == 1
    assert parsed.ticket_id == store.ticket_id(1, visitor("ada"))
    assert parsed.status is TicketStatus.WAITING
    assert parsed.priority == 1
    assert parsed.joined_ms == joined_ms
    assert parsed.seen_s == joined_ms // 1000
    assert parsed.display_name == "Ada"
    assert parsed.reason == ""
    assert parsed.line_score is None


def test_it_parses_a_finished_tickets_record_with_its_reason(make_queue, clock):
    queue = make_queue(state="paused")
    ada = join(queue.slug, "ada", now=clock.now)
    run("leave", keys(queue.slug), (visitor("ada"), ada.seq, ms(clock.advance(1))))

    parsed = store.TicketRecord.parse(visitor("ada"), record(queue.slug, "ada"))

    assert (parsed.status, parsed.reason, parsed.line_score) == (TicketStatus.EXPIRED, "left", None)


def test_it_parses_a_parked_tickets_record_with_the_line_score_it_keeps(make_queue, clock):
    queue = make_queue(state="paused", presence_timeout=60, abandon_timeout=3600)
    ada = join(queue.slug, "ada", now=clock.now)
    services.queue_resume(queue, actor_label="tests")
    run("admit", keys(queue.slug), (ms(clock.advance(120)), "", 10, 40))  # absent at the head: parked
    assert store.away_members(queue.slug) == [ada.ticket_id]

    parsed = store.TicketRecord.parse(visitor("ada"), record(queue.slug, "ada"))

    assert parsed.status is TicketStatus.WAITING
    assert parsed.reason == ""
    assert parsed.line_score == ada.score == float(ada.seq)


# --- window/join.lua, window/tick.lua: Window, WindowStep ------------------------------------------------


@pytest.fixture
def window_queue(make_queue) -> Queue:
    return make_queue(
        mode="stateless",
        name="Concert",
        target_url="https://tickets.example/buy",
        window_size=3,
        window_interval=10,
        active_windows=2,
        session_ttl=480,
    )


def window_join_raw(slug: str, now_ms: int) -> Any:
    qk = store.queue_keys(slug)
    return run("window/join", [qk.win, qk.tagged("pow:")], [now_ms, 0, 0, *store.WINDOW_FIELDS])


def window_moved_at(slug: str) -> int:
    return int(cast(str, store.client().hget(store.queue_keys(slug).win, "at")))


def test_it_parses_a_stateless_join_into_the_window_with_the_first_number(window_queue, clock):
    raw = window_join_raw(window_queue.slug, ms(clock.now))
    outcome, fields = raw
    window = store.Window.parse(fields)

    assert outcome == "created"
    assert window.next_number == 1
    assert window.issued == 1
    assert window.live is True
    assert window.epoch == epoch_of(window_queue)
    assert window.state == "open"
    assert (window.size, window.interval_ms, window.windows) == (3, 10_000, 2)
    assert window.active == 0
    assert window.admitted == 0
    assert window.at_ms == window_moved_at(window_queue.slug) > 0
    assert window.target_url == "https://tickets.example/buy"
    assert window.name == "Concert"
    assert window.session_ttl == 480
    assert (window.starts_ms, window.ends_ms, window.prequeue_ms) == (0, 0, 0)
    assert window.shuffle_pending is False
    assert (window.prequeue, window.seed) == (None, "")
    assert window.ticket_gap == 0
    assert len(fields) == len(store.WINDOW_FIELDS)

    second = store.Window.parse(window_join_raw(window_queue.slug, ms(clock.now))[1])
    assert (second.next_number, second.issued) == (2, 2)


def test_it_refuses_a_window_with_a_field_too_many_or_too_few(window_queue, clock):
    _, fields = window_join_raw(window_queue.slug, ms(clock.now))
    refuses_a_missing_and_an_extra_field(store.Window.parse, fields)


def test_it_parses_a_window_step_with_the_places_it_covers(window_queue, clock):
    slug = window_queue.slug
    for _ in range(2):
        window_join_raw(slug, ms(clock.now))
    qk = store.queue_keys(slug)
    moved_at = window_moved_at(slug)
    step_ms = moved_at + 10_000  # one interval after the window last moved

    raw = run("window/tick", [qk.win, qk.leader], [step_ms, ""])
    step = store.WindowStep.parse(raw)

    assert (step.outcome, step.stepped, step.active, step.issued, step.evseq) == ("ok", True, 3, 2, 1)
    assert isinstance(step.stepped, bool)
    assert window_moved_at(slug) == step_ms

    idle = store.WindowStep.parse(run("window/tick", [qk.win, qk.leader], [step_ms + 1000, ""]))
    assert (idle.outcome, idle.stepped, idle.active, idle.issued, idle.evseq) == ("ok", False, 3, 2, 1)
    assert idle.at_ms == step_ms  # when the window last moved
    refuses_a_missing_and_an_extra_field(store.WindowStep.parse, raw)


def test_it_reports_the_moment_a_window_step_moved_the_window_as_when_it_last_moved(window_queue, clock):
    qk = store.queue_keys(window_queue.slug)
    window_join_raw(window_queue.slug, ms(clock.now))
    step_ms = window_moved_at(window_queue.slug) + 10_000

    step = store.WindowStep.parse(run("window/tick", [qk.win, qk.leader], [step_ms, ""]))

    assert step.stepped is True
    assert step.at_ms == step_ms


def test_it_parses_a_window_step_with_a_stale_leader_token_as_not_leader(window_queue, clock):
    qk = store.queue_keys(window_queue.slug)
    step = store.WindowStep.parse(run("window/tick", [qk.win, qk.leader], [ms(clock.now), "node-a:1"]))
    assert tuple(step) == ("not_leader", False, 0, 0, 0, 0)


# --- lua/limits/: LimitReply -----------------------------------------------------------------------------


def limit_key() -> str:
    return store.limit_key("test", uuid.uuid4().hex)


def test_it_parses_a_token_buckets_refusal_with_the_time_to_the_next_token(db):
    key = limit_key()
    args = (T0_MS, 2, 4, 1)  # two tokens, four a second, one a request

    replies = [store.LimitReply.parse(run("limits/token_bucket", [key], args)) for _ in range(3)]

    assert tuple(replies[0]) == (True, 0, 1.0, 0)
    assert tuple(replies[1]) == (True, 0, 0.0, 0)
    assert tuple(replies[2]) == (False, 250, 0.0, 0)  # a token every 250 ms
    assert isinstance(replies[2].allowed, bool) and isinstance(replies[2].remaining, float)
    refuses_a_missing_and_an_extra_field(store.LimitReply.parse, run("limits/token_bucket", [key], args))


def test_it_parses_a_leaking_buckets_wait_for_each_request_s_turn(db):
    key = limit_key()
    args = (T0_MS, 3, 2)  # three places, two a second

    replies = [store.LimitReply.parse(run("limits/leaking_bucket", [key], args)) for _ in range(4)]

    assert [r.wait_ms for r in replies[:3]] == [0, 500, 1000]
    assert [r.remaining for r in replies[:3]] == [2.0, 1.0, 0.0]
    assert (replies[3].allowed, replies[3].retry_ms) == (False, 500)


def test_it_parses_a_sliding_window_counters_weighted_count_as_a_fraction(db):
    key = limit_key()
    for _ in range(7):
        run("limits/sliding_window_counter", [key], (T0_MS, 10_000, 10_000, 100, "none"))

    # 30 % into the next window: 70 % of the previous window's 7 still count.
    reply = store.LimitReply.parse(
        run("limits/sliding_window_counter", [key], (T0_MS + 13_000, 10_000, 10_000, 100, "none"))
    )

    assert reply.allowed is True
    assert reply.remaining == pytest.approx(4.9)


# --- store.health -----------------------------------------------------------------------------------------


def test_it_keeps_health_reports_longer_than_the_longest_adjustment_interval_reads_them():
    assert store.HEALTH_KEEP_SECONDS > models.ADAPTIVE_INTERVAL_MAX_SECONDS
