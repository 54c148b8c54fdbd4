"""Regressions found in review: absent visitors at the head, bucket size vs the leader lease, premium
order, deleted queues, public statuses, key rotation across processes, poll interval vs claim TTL."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import jwt
import pytest

from queueing import selectors, services, signing_keys, store, tokens
from queueing.models import Queue
from queueing.store import TicketStatus

from .factories import access_claims, join, rank_of, status

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def test_absent_visitors_at_the_head_are_parked_so_present_ones_behind_them_get_in(make_queue, clock):
    queue = make_queue(state="paused", capacity=100, burst=100, presence_timeout=30, abandon_timeout=600)
    absent = [join(queue.slug, f"a{i}", now=clock()) for i in range(300)]
    present = join(queue.slug, "present", now=clock())
    clock.advance(60)
    status(queue.slug, present, now=clock())
    services.queue_resume(queue)
    # Each call looks at most 50 entries; the absent ones it meets leave the line and are not met again.
    calls = 0
    while status(queue.slug, present, now=clock()).status == TicketStatus.WAITING:
        store.admit(queue.slug, now_ms=int(clock.advance(1) * 1000), max_admit=100, scan_limit=50)
        calls += 1
        assert calls <= 7
    assert len(store.away_members(queue.slug)) == 300 and store.line_members(queue.slug) == []
    assert store.snapshot(queue.slug).waiting == 300
    # A parked visitor who polls again gets its place back: the front, as it joined first.
    back = status(queue.slug, absent[0], now=clock())
    assert (back.status, back.rank) == (TicketStatus.WAITING, 0)
    assert store.line_members(queue.slug) == [absent[0].ticket_id]
    returned = next(r for r in store.ticket_records(queue.slug) if r.ticket_id == absent[0].ticket_id)
    assert returned.line_score is None  # back to the small waiting record
    reply = services.queue_admit(slug=queue.slug, now=clock.advance(1))
    assert [a.ticket_id for a in reply.admitted] == [absent[0].ticket_id]


def test_parked_visitors_keep_first_come_first_served_order_when_they_return(make_queue, clock):
    queue = make_queue(state="paused", capacity=1, burst=1, presence_timeout=10, abandon_timeout=600)
    tickets = [join(queue.slug, f"v{i}", now=clock()) for i in range(4)]
    clock.advance(20)
    status(queue.slug, tickets[3], now=clock())
    services.queue_resume(queue)
    services.queue_admit(slug=queue.slug, now=clock.advance(1))  # parks v0..v2, admits v3
    for ticket in reversed(tickets[:3]):  # they come back in reverse order...
        status(queue.slug, ticket, now=clock())
    assert store.line_members(queue.slug) == [t.ticket_id for t in tickets[:3]]  # ...to their own places


def test_parked_visitors_absent_past_the_abandon_timeout_expire(make_queue, clock):
    queue = make_queue(state="paused", capacity=5, burst=5, presence_timeout=10, abandon_timeout=60)
    gone = join(queue.slug, "gone", now=clock())
    here = join(queue.slug, "here", now=clock())
    clock.advance(20)
    status(queue.slug, here, now=clock())
    services.queue_resume(queue)
    services.queue_admit(slug=queue.slug, now=clock())
    assert store.away_members(queue.slug) == [gone.ticket_id]
    reply = services.queue_cleanup(slug=queue.slug, now=clock.advance(45))
    assert reply.abandoned == [gone.ticket_id]
    assert store.away_members(queue.slug) == []
    assert status(queue.slug, gone, now=clock()).reason == "abandoned"


def test_a_full_queue_counts_parked_visitors(make_queue, clock):
    queue = make_queue(state="paused", capacity=1, burst=5, presence_timeout=10, max_waiting=2)
    join(queue.slug, "a", now=clock())
    b = join(queue.slug, "b", now=clock())
    clock.advance(20)
    status(queue.slug, b, now=clock())
    services.queue_resume(queue)
    services.queue_admit(slug=queue.slug, now=clock())  # parks a, admits b
    join(queue.slug, "c", now=clock())
    with pytest.raises(services.QueueFull):
        join(queue.slug, "d", now=clock())


def test_the_bucket_holds_a_lease_and_a_second_of_outflow_so_missed_ticks_lose_nothing(make_queue, clock, settings):
    # 60/min, burst 1, lease 3 s: a leader that gets no tick for 3.5 s still admits what it is owed.
    settings.WR_LEADER_TTL_MS = 3000
    queue = make_queue(state="paused", capacity=100, burst=1, outflow_per_minute=60)
    for i in range(10):
        join(queue.slug, f"v{i}", now=clock())
    services.queue_resume(queue)
    assert len(services.queue_admit(slug=queue.slug, now=clock()).admitted) == 1
    assert len(services.queue_admit(slug=queue.slug, now=clock.advance(3.5)).admitted) == 3
    assert len(services.queue_admit(slug=queue.slug, now=clock.advance(10)).admitted) == 4  # the bucket's size


def test_an_earlier_premium_joiner_is_admitted_before_a_later_one(make_queue, clock):
    queue = make_queue(capacity=1, burst=1, outflow_per_minute=0.1)
    holder = join(queue.slug, "holder", now=clock())  # the only slot and the only token
    first = join(queue.slug, "premium-1", now=clock(), priority=3)
    assert first.status == TicketStatus.WAITING
    services.session_complete(slug=queue.slug, claims=access_claims(queue.slug, holder), now=clock.advance(1))
    # The freed slot goes to the waiting premium visitor although the bucket is empty...
    assert status(queue.slug, first, now=clock()).status == TicketStatus.ADMITTED
    # ...and a later premium joiner waits for the next slot.
    assert join(queue.slug, "premium-2", now=clock(), priority=3).status == TicketStatus.WAITING


def test_a_later_premium_joiner_does_not_jump_a_waiting_one_even_with_a_free_slot(make_queue, clock):
    queue = make_queue(state="paused", capacity=2, burst=1)
    first = join(queue.slug, "premium-1", now=clock(), priority=3)  # paused: waits at the front
    services.queue_resume(queue)
    second = join(queue.slug, "premium-2", now=clock(), priority=3)
    assert second.status == TicketStatus.WAITING and rank_of(second) == 1
    reply = services.queue_admit(slug=queue.slug, now=clock())
    assert [a.ticket_id for a in reply.admitted] == [first.ticket_id, second.ticket_id]


def test_deleting_a_queue_in_admin_removes_its_redis_state(client, make_queue, clock, django_user_model):
    queue = make_queue()
    join(queue.slug, "v", now=clock())
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    response = client.post(f"/admin/queueing/queue/{queue.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Queue.objects.filter(slug=queue.slug).exists()
    assert store.config_read(queue.slug) == {}
    assert store.snapshot(queue.slug).stats == {}
    with pytest.raises(services.QueueNotFound):
        join(queue.slug, "after", now=clock())


def test_cleanup_drops_redis_state_of_queues_deleted_behind_its_back(make_queue, clock):
    gone = make_queue()
    join(gone.slug, "v", now=clock())
    Queue.objects.filter(pk=gone.pk).delete()  # no service: e.g. a shell
    fresh = "not-committed-yet"
    store.config_write(fresh, {"state": "open", "synced_at": int(clock())})  # a queue mid-creation
    assert services.queues_orphans_delete(now=clock()) == []  # within the grace minute: kept
    assert services.queues_orphans_delete(now=clock.advance(61)) == sorted([gone.slug, fresh])
    assert store.queue_slugs() == []


def test_a_revoked_ticket_reads_as_expired_with_the_reason(api, make_queue):
    import uuid

    queue = make_queue(state="paused")
    body = api.post(f"/api/v1/queues/{queue.slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4())).json()
    services.session_revoke(slug=queue.slug, ticket_id=body["ticket_id"])
    polled = api.get(f"/api/v1/queues/{queue.slug}/status", HTTP_AUTHORIZATION=f"Bearer {body['ticket']}").json()
    assert (polled["status"], polled["reason"]) == ("expired", "revoked")


def test_a_token_from_a_key_rotated_in_elsewhere_verifies_at_once(db):
    ring = signing_keys._keys.get()
    signing_keys._keys._ring = dataclasses.replace(ring, loaded_at=ring.loaded_at - 5)  # loaded a while ago
    new = signing_keys.signing_key_rotate(lead=timedelta(0))  # another process rotates, with no lead
    signing_keys._keys._ring = dataclasses.replace(ring, loaded_at=ring.loaded_at - 5)  # this one has not reloaded
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(new.private_key_pem.encode(), password=None)
    payload = {"iss": "waitingroom", "aud": "q", "sub": "0000000001." + "A" * 16, "fence": 1, "exp": 2_000_000_000}
    token = jwt.encode(payload, private, algorithm="EdDSA", headers={"kid": new.kid})  # type: ignore[arg-type]
    assert tokens.access_token_decode(token, slug="q").fence == 1


def test_polls_come_often_enough_not_to_miss_a_short_claim(make_queue, clock):
    queue = make_queue(state="paused", claim_ttl=8, presence_timeout=300, abandon_timeout=600)
    for i in range(500):
        join(queue.slug, f"v{i}", now=clock())
    services.queue_resume(queue)
    reply = store.status(
        queue.slug,
        visitor_key=store.parse_ticket_id(store.line_members(queue.slug)[-1])[1],  # type: ignore[index]
        seq=500,
        now_ms=int(clock() * 1000),
    )
    assert reply.ticket is not None and reply.figures is not None
    assert all(selectors.poll_after_seconds(reply.ticket, reply.figures) <= 4 * 1.2 for _ in range(50))


def test_burst_is_the_most_admitted_at_once_after_a_pause(make_queue, clock, settings):
    """Seen: burst 5 admitted 6 in one tick (the bucket held a lease and a second of outflow whatever the
    burst). The pause's ticks keep running; resuming admits `burst`, then the outflow, nothing lost."""
    settings.WR_LEADER_TTL_MS = 3000
    queue = make_queue(
        state="paused", capacity=1000, burst=5, outflow_per_minute=90, presence_timeout=600, abandon_timeout=900
    )
    for i in range(40):
        join(queue.slug, f"v{i}", now=clock())
    for _ in range(60):  # a minute paused, the tick coming every second
        services.queue_admit(slug=queue.slug, now=clock.advance(1))
    services.queue_resume(queue)
    assert len(services.queue_admit(slug=queue.slug, now=clock.advance(1)).admitted) == 5
    later = sum(len(services.queue_admit(slug=queue.slug, now=clock.advance(1)).admitted) for _ in range(10))
    assert later == 15  # 1.5 a second: the half visitors are carried, not lost
