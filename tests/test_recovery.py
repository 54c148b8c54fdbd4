"""Lost Redis state (issue 6, part 4; SPEC 3.6): epochs, reserved sequence numbers, tickets and sessions
of an earlier epoch given back their places.

"Redis loses the state" is real here: a private redis-server of the test's own, emptied by FLUSHALL or
restarted without persistence (the shared server is never flushed).
"""

from __future__ import annotations

import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from queueing import modes, selectors, services, store, tokens
from queueing.models import PriorityCode, Queue, QueueChange, QueueShuffle

from .factories import decode_ticket, join, visitor
from .stack import free_port, redis_server
from .test_schedule import at


@dataclass
class PrivateRedis:
    url: str
    port: int
    process: subprocess.Popen[bytes]

    def flushall(self) -> None:
        redis.Redis.from_url(self.url).flushall()

    def restart(self) -> None:
        """Stop the server and start it again: with no persistence it comes back empty."""
        self.process.terminate()
        self.process.wait(timeout=10)
        self.process = _start(self.port)


def _start(port: int) -> subprocess.Popen[bytes]:
    return redis_server(port)  # no persistence: a restart comes back empty


@pytest.fixture
def private_redis(settings) -> Iterator[PrivateRedis]:
    port = free_port()
    server = PrivateRedis(f"redis://127.0.0.1:{port}/0", port, _start(port))
    settings.REDIS_URL = server.url  # store reconnects when the URL changes
    settings.REDIS_CLUSTER_NODES = ""  # a server of the test's own, not the cluster (conftest.live_state)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


def url(slug: str, op: str) -> str:
    return f"/api/v1/queues/{slug}/{op}"


def api_join(api, slug: str, visitor_id: str | None = None, **body):
    response = api.post(url(slug, "join"), body, format="json", HTTP_X_VISITOR_ID=visitor_id or str(uuid.uuid4()))
    assert response.status_code in (200, 201), response.content
    return response.json()


def api_poll(api, slug: str, ticket: str) -> dict:
    response = api.get(url(slug, "status"), HTTP_AUTHORIZATION=f"Bearer {ticket}")
    assert response.status_code == 200, response.content
    return response.json()


def claims_of(slug: str, ticket: store.TicketState, *, epoch: int = 1) -> tokens.TicketClaims:
    """What the visitor's signed ticket says (as the API signs it at join)."""
    raw = tokens.ticket_issue(
        slug=slug,
        ticket_id=ticket.ticket_id,
        seq=ticket.seq,
        priority=ticket.priority,
        epoch=epoch,
        placement=ticket.score,
    )
    return decode_ticket(raw, slug=slug)


def access_token(slug: str, ticket: store.TicketState) -> str:
    """The access token an admission of epoch 1 gave `ticket`."""
    return tokens.access_token_issue(
        slug=slug, ticket_id=ticket.ticket_id, fence=ticket.fence, expires_ms=ticket.expires_ms, epoch=1
    )


def test_flushing_redis_mid_queue_gives_old_tickets_their_order_back_ahead_of_new_joiners(
    api, make_queue, private_redis
):
    queue = make_queue(state="paused", capacity=5)
    PriorityCode.objects.create(queue=queue, code="VIP-CODE", level=2)
    slug = queue.slug
    old = [api_join(api, slug) for _ in range(6)]
    old.append(api_join(api, slug, priority_code="VIP-CODE"))  # ahead of the last half of the line
    before = {t["ticket_id"]: api_poll(api, slug, t["ticket"])["position"] for t in old}
    assert sorted(before.values()) == list(range(1, 8)) and before[old[-1]["ticket_id"]] == 4

    private_redis.flushall()
    new = [api_join(api, slug) for _ in range(3)]  # the first request after the loss starts epoch 2
    queue.refresh_from_db()
    assert queue.epoch == 2
    assert min(int(t["ticket_id"][:10]) for t in new) > max(int(t["ticket_id"][:10]) for t in old)
    assert [t["position"] for t in new] == [1, 2, 3]

    random.shuffle(old)  # they come back in any order
    answers = {t["ticket_id"]: api_poll(api, slug, t["ticket"]) for t in old}
    assert all(a["status"] == "waiting" and a["epoch"] == 2 for a in answers.values())
    after = {t["ticket_id"]: api_poll(api, slug, t["ticket"])["position"] for t in old}
    assert after == before  # the same order, ahead of everyone who joined after the loss
    assert [api_poll(api, slug, t["ticket"])["position"] for t in new] == [8, 9, 10]

    stats = selectors.queue_stats_get(slug=slug)
    assert stats["waiting"] == 10 and stats["totals"]["restored"] == 7 and stats["epoch"] == 2
    # A VIP of the new epoch would go ahead of half the line, but never ahead of a ticket of the old one:
    # right behind them, ahead of the new epoch's normal joiners.
    again = api_join(api, slug, priority_code="VIP-CODE")
    assert again["position"] == 8
    assert QueueChange.objects.filter(queue=queue, action="epoch").count() == 1


def test_a_visitor_who_joins_again_after_the_loss_gets_its_restored_ticket_back(api, make_queue, private_redis):
    queue = make_queue(state="paused")
    someone = str(uuid.uuid4())
    first = api_join(api, queue.slug, someone)
    api_join(api, queue.slug)
    private_redis.flushall()
    assert api_poll(api, queue.slug, first["ticket"])["position"] == 1  # restored by its poll
    again = api.post(url(queue.slug, "join"), {}, format="json", HTTP_X_VISITOR_ID=someone)
    assert again.status_code == 200 and again.json()["ticket_id"] == first["ticket_id"]
    assert selectors.queue_stats_get(slug=queue.slug)["waiting"] == 1


def test_a_restart_without_persistence_is_detected_by_the_next_tick_which_starts_a_new_epoch(
    make_queue, private_redis, clock
):
    queue = make_queue(state="paused")
    old = [join(queue.slug, f"v{i}", now=clock()) for i in range(3)]
    reserved = Queue.objects.get(pk=queue.pk).seq_reserved
    private_redis.restart()
    assert store.live_state(queue.slug).epoch is None  # empty

    services.queues_tick(now=clock.advance(1))
    queue.refresh_from_db()
    assert queue.epoch == 2 and store.live_state(queue.slug) == store.LiveState(2, reserved)
    change = QueueChange.objects.get(queue=queue, action="epoch")
    assert change.before == {"epoch": 1}
    assert change.after == {"epoch": 2, "sequence_floor": reserved, "admissions_held_seconds": 60.0}
    assert store.config_read(queue.slug)["state"] == "paused"  # the policy is back too

    services.queues_tick(now=clock.advance(1))  # the next tick finds the epoch running: nothing more
    assert Queue.objects.get(pk=queue.pk).epoch == 2
    fresh = join(queue.slug, "after", now=clock())
    assert fresh.seq == reserved + 1 > max(t.seq for t in old)


def test_sequence_numbers_never_go_back_and_none_is_issued_twice_across_losses(
    make_queue, private_redis, settings, clock
):
    settings.WR_SEQ_BLOCK = 4  # reservations run out often: joins reserve more themselves
    queue = make_queue(state="paused")
    seqs: list[int] = []
    for round_ in range(3):
        seqs += [join(queue.slug, f"r{round_}-{i}", now=clock()).seq for i in range(7)]
        private_redis.flushall()
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) == 21
    queue.refresh_from_db()
    assert queue.epoch == 3 and queue.seq_reserved >= max(seqs)


def test_reserved_numbers_are_topped_up_by_the_tick_before_joins_run_out(make_queue, settings, clock):
    settings.WR_SEQ_BLOCK = 10
    queue = make_queue(state="paused")
    assert Queue.objects.get(pk=queue.pk).seq_reserved == 10
    for i in range(6):
        join(queue.slug, f"v{i}", now=clock())
    assert Queue.objects.get(pk=queue.pk).seq_reserved == 10  # joins alone do not write the database
    services.queues_tick(now=clock.advance(1))  # 4 left, under half a block: reserve another
    assert Queue.objects.get(pk=queue.pk).seq_reserved == 20
    assert store.config_read(queue.slug)["seq_max"] == "20"
    assert [join(queue.slug, f"w{i}", now=clock()).seq for i in range(12)] == list(range(7, 19))


def test_the_pre_queue_shuffle_survives_a_loss(make_queue, private_redis, clock):
    t0 = clock.now
    queue = make_queue(
        state="open",
        capacity=1,
        presence_timeout=600,
        abandon_timeout=3600,
        prequeue_opens_at=at(t0 + 10),
        starts_at=at(t0 + 20),
    )
    prequeue = [join(queue.slug, f"p{i}", now=t0 + 11 + i) for i in range(8)]
    services.queue_tick(slug=queue.slug, now=t0 + 21)  # the shuffle; the first in its order is admitted
    order = QueueShuffle.objects.get(queue=queue).order
    later = join(queue.slug, "later", now=t0 + 22)
    private_redis.flushall()

    by_seq = {t.seq: t for t in [*prequeue, later]}
    for seq in random.sample(list(by_seq), len(by_seq)):
        modes.status(claims=claims_of(queue.slug, by_seq[seq]), now=t0 + 23)
    ranks = {seq: modes.status(claims=claims_of(queue.slug, t), now=t0 + 24).ahead or 0 for seq, t in by_seq.items()}
    # All of them back in line (the one admitted before the loss too, at its shuffled place), in the
    # shuffle's order, the later joiner behind the pre-queue.
    assert sorted(ranks, key=lambda seq: ranks[seq]) == [*order, later.seq]


def test_a_visitor_at_the_site_keeps_its_session_through_a_loss(make_queue, private_redis, clock):
    queue = make_queue(capacity=1)
    inside = join(queue.slug, "inside", now=clock())
    assert inside.status == store.TicketStatus.ADMITTED
    token = access_token(queue.slug, inside)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    private_redis.flushall()

    verdict = services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(1))
    assert verdict.valid and verdict.expires_at == inside.expires_ms // 1000
    waiting = join(queue.slug, "next", now=clock())
    assert waiting.status == store.TicketStatus.WAITING  # the restored session holds the only slot
    claims = tokens.access_token_decode(token, slug=queue.slug)
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(1)) == "completed"
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).reason == "expired"
    reply = modes.status(claims=claims_of(queue.slug, waiting, epoch=2), now=clock())
    assert reply.status == "admitted"  # the freed slot went to the next visitor at once


def test_a_restored_ticket_that_left_is_not_restored_again(make_queue, private_redis, clock):
    queue = make_queue(state="paused")
    ticket = join(queue.slug, "v", now=clock())
    private_redis.flushall()
    claims = claims_of(queue.slug, ticket)
    assert modes.status(claims=claims, now=clock.advance(1)).position == 1
    assert services.ticket_leave(slug=queue.slug, claims=claims, now=clock.advance(1))
    services.queue_cleanup(slug=queue.slug, now=clock.advance(queue.abandon_timeout / 2))  # keeps the record
    view = modes.status(claims=claims, now=clock.advance(1))
    assert (view.status, view.reason) == ("expired", "left")
    assert store.snapshot(queue.slug).waiting == 0


def test_old_tickets_are_not_restored_once_the_window_after_the_loss_has_passed(make_queue, private_redis, clock):
    queue = make_queue(state="paused", abandon_timeout=60)
    ticket = join(queue.slug, "slow", now=clock())
    private_redis.flushall()
    services.queues_tick(now=clock.advance(1))  # the new epoch: its window lasts the abandon timeout
    with pytest.raises(selectors.TicketGone):
        modes.status(claims=claims_of(queue.slug, ticket), now=clock.advance(61))


def test_an_old_ticket_of_a_visitor_who_took_a_new_one_is_not_restored(make_queue, private_redis, clock):
    queue = make_queue(state="paused")
    old = join(queue.slug, "v", now=clock())
    private_redis.flushall()
    new = join(queue.slug, "v", now=clock())  # e.g. a page without the old ticket joined again
    assert new.seq > old.seq
    with pytest.raises(selectors.TicketGone):
        modes.status(claims=claims_of(queue.slug, old), now=clock())
    assert store.snapshot(queue.slug).waiting == 1


def test_a_queue_never_used_starts_its_first_epoch_without_calling_it_a_loss(make_queue):
    queue = make_queue()
    assert Queue.objects.get(pk=queue.pk).epoch == 1
    assert store.live_state(queue.slug).epoch == 1
    assert not QueueChange.objects.filter(queue=queue, action="epoch").exists()


def test_scripts_refuse_to_run_on_a_policy_whose_epoch_was_not_started(make_queue):
    queue = make_queue(state="paused")
    store.client().hdel(store.queue_keys(queue.slug).cfg, "live_epoch")
    raw = store.join(queue.slug, visitor_key=visitor("x"), now_ms=int(time.time() * 1000), priority=0, display_name="")
    assert raw.outcome == "no_config"  # nobody gets a number until the epoch (and its floor) is set
    ticket = join(queue.slug, "x")  # the service starts the epoch (a new one: numbers were handed out)
    assert ticket.seq > 0 and Queue.objects.get(pk=queue.pk).epoch == 2


def _used(slug: str) -> int:
    snap = store.snapshot(slug)
    return snap.admitted + snap.active


def test_capacity_holds_across_a_loss_restored_sessions_take_their_slots_before_anyone_new(
    make_queue, private_redis, clock, settings
):
    """Capacity 5, five verified sessions, ten waiting; Redis loses everything. Before the fix the new
    epoch admitted five at once and the five old tokens then restored theirs: ten on a capacity of five."""
    settings.WR_RESTORE_HOLD_SECONDS = 30
    queue = make_queue(capacity=5, outflow_per_minute=6000, burst=50)
    inside = [join(queue.slug, f"in{i}", now=clock()) for i in range(5)]
    access = []
    for ticket in inside:
        assert ticket.status == store.TicketStatus.ADMITTED
        access.append(access_token(queue.slug, ticket))
        assert services.session_verify(slug=queue.slug, raw_token=access[-1], now=clock()).valid
    waiting = [join(queue.slug, f"w{i}", now=clock()) for i in range(10)]
    assert all(t.status == store.TicketStatus.WAITING for t in waiting)
    private_redis.flushall()

    services.queues_tick(now=clock.advance(1))  # the new epoch starts
    for ticket in waiting:  # the waiting come back first, and ticks keep running
        modes.status(claims=claims_of(queue.slug, ticket), now=clock.advance(0.1))
    services.queues_tick(now=clock.advance(1))
    assert _used(queue.slug) == 0  # nobody new while the old sessions may come back
    for token in access[:4]:  # four of the five are still at the site: their next request restores them
        assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(1)).valid
        services.queues_tick(now=clock())
        assert _used(queue.slug) <= queue.capacity

    services.queues_tick(now=clock.advance(30))  # the hold is over: one free slot, one admission
    assert _used(queue.slug) == 5
    late = services.session_verify(slug=queue.slug, raw_token=access[4], now=clock.advance(1))
    assert (late.valid, late.reason) == (False, "full")
    assert _used(queue.slug) == 5
    epoch = QueueChange.objects.filter(queue=queue, action="epoch").get()
    assert epoch.after["admissions_held_seconds"] == 30.0


def test_after_the_hold_a_returning_session_takes_a_free_slot(make_queue, private_redis, clock, settings):
    settings.WR_RESTORE_HOLD_SECONDS = 10
    queue = make_queue(capacity=2)
    ticket = join(queue.slug, "inside", now=clock())
    token = access_token(queue.slug, ticket)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    private_redis.flushall()
    services.queues_tick(now=clock.advance(1))
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(20)).valid
    assert _used(queue.slug) == 1


def test_a_process_holding_an_older_copy_of_the_queue_cannot_take_the_epoch_back(make_queue, private_redis, clock):
    """Seen under parallel traffic after a loss: a request that had read the queue before another process
    started the next epoch mirrored the policy with the old epoch, so every script answered no_config and
    a returning visitor was told their ticket was gone."""
    queue = make_queue(state="paused")
    ticket = join(queue.slug, "v", now=clock())
    stale = Queue.objects.get(pk=queue.pk)
    private_redis.flushall()
    services.queues_tick(now=clock.advance(1))  # epoch 2 begins
    assert Queue.objects.get(pk=queue.pk).epoch == 2

    store.config_write(queue.slug, {**stale.policy(), "seq_max": stale.seq_reserved})  # the late writer
    assert store.config_read(queue.slug)["epoch"] == "2"
    assert store.live_state(queue.slug).epoch == 2
    assert modes.status(claims=claims_of(queue.slug, ticket), now=clock.advance(1)).position == 1


def test_a_session_lost_with_the_state_can_be_completed_and_then_not_started_again(make_queue, private_redis, clock):
    """Seen in the fault suite: the site completing a session after Redis lost it got 409 session_not_active."""
    queue = make_queue(capacity=1)
    inside = join(queue.slug, "inside", now=clock())
    token = access_token(queue.slug, inside)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    private_redis.flushall()
    services.queues_tick(now=clock.advance(1))
    claims = tokens.access_token_decode(token, slug=queue.slug)
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(1)) == "completed"
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(1)) == "already"
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(1)).reason == "expired"
    assert _used(queue.slug) == 0


def test_a_restored_session_s_hold_counts_from_its_admission_not_from_the_loss(make_queue, private_redis, clock):
    """A session restored after a loss was recorded as admitted at its restoring: one admitted 100 s before
    the loss and completed 19 s after its restoring taught the estimate sessions of 19 s, not of 121
    (capacity-bound queues were then told waits far too short). Its token says when it was admitted: its
    end less the session's length."""
    queue = make_queue(capacity=1, session_ttl=600)
    inside = join(queue.slug, "inside", now=clock())
    token = access_token(queue.slug, inside)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    clock.advance(100)
    private_redis.flushall()
    services.queues_tick(now=clock.advance(1))
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(1)).valid  # restored
    claims = tokens.access_token_decode(token, slug=queue.slug)
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(19)) == "completed"
    assert float(store.snapshot(queue.slug).stats["ema_service_ms"]) == pytest.approx(121_000, abs=1000)


def test_a_session_completed_before_any_tick_after_the_loss_is_completed_not_refused(make_queue, private_redis, clock):
    """Seen in the fault suite: the site completing a session right after Redis restarted without its data,
    before a tick mirrored the queue's policy again, got 409 session_not_active (no_config)."""
    queue = make_queue(capacity=1)
    inside = join(queue.slug, "inside", now=clock())
    token = access_token(queue.slug, inside)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    private_redis.restart()  # no persistence: it comes back empty, and without the scripts
    claims = tokens.access_token_decode(token, slug=queue.slug)
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(1)) == "completed"
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock.advance(1)).reason == "expired"
    assert _used(queue.slug) == 0


def test_finished_tickets_are_not_given_back_a_place_or_a_session_after_a_loss(make_queue, private_redis, clock):
    """Seen: after a queue's keys were lost, a ticket that had left came back at position 1, ahead of live
    visitors (equally a revoked, completed or expired one)."""
    queue = make_queue(capacity=2, abandon_timeout=120, presence_timeout=60)
    done = join(queue.slug, "done", now=clock())  # admitted, then completed
    kicked = join(queue.slug, "kicked", now=clock())  # admitted, then revoked
    services.queue_pause(queue)  # the others wait, whatever the two freed slots
    left = join(queue.slug, "left", now=clock())
    gone = join(queue.slug, "gone", now=clock())  # never polls again: abandoned
    live = join(queue.slug, "live", now=clock())
    assert (done.status, kicked.status) == (store.TicketStatus.ADMITTED, store.TicketStatus.ADMITTED)
    token = access_token(queue.slug, done)
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).valid
    assert (
        services.session_complete(
            slug=queue.slug, claims=tokens.access_token_decode(token, slug=queue.slug), now=clock()
        )
        == "completed"
    )
    services.session_revoke(slug=queue.slug, ticket_id=kicked.ticket_id, now=clock())
    assert services.ticket_leave(slug=queue.slug, claims=claims_of(queue.slug, left), now=clock())
    for _ in range(3):  # the live one keeps polling; the gone one is abandoned
        modes.status(claims=claims_of(queue.slug, live), now=clock.advance(50))
    services.queues_cleanup(now=clock())  # notes the finished ones in the database
    assert set(queue.finished_tickets.values_list("seq", flat=True)) >= {done.seq, kicked.seq, left.seq, gone.seq}

    private_redis.flushall()
    services.queue_live_state_ensure(queue.pk, now=clock.advance(1))  # the loss noticed, on this test's clock
    for finished in (done, kicked, left, gone):
        with pytest.raises(selectors.TicketGone):
            modes.status(claims=claims_of(queue.slug, finished), now=clock.advance(0.1))
    assert services.session_verify(slug=queue.slug, raw_token=token, now=clock()).reason == "expired"
    assert modes.status(claims=claims_of(queue.slug, live), now=clock()).position == 1
