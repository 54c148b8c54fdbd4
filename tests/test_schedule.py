"""Scheduled sales (issue 6, part 1): the pre-queue opening, the auditable shuffle at the start, the
end; with a controlled clock and real Redis."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from queueing import selectors, services, shuffle, store
from queueing.models import Queue, QueueChange, QueueShuffle

from .factories import join, status


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


@pytest.fixture
def sale(make_queue, clock) -> Queue:
    t0 = clock.now
    return make_queue(
        capacity=3,
        outflow_per_minute=600,
        burst=10,
        presence_timeout=600,
        abandon_timeout=3600,
        prequeue_opens_at=at(t0 + 60),
        starts_at=at(t0 + 120),
        ends_at=at(t0 + 600),
    )


def test_a_sale_goes_from_not_open_to_pre_queue_to_shuffled_start_to_closed_on_time(sale, clock):
    t0, slug = clock.now, sale.slug
    with pytest.raises(services.QueueNotOpen):
        join(slug, "early", now=t0)
    prequeue = [join(slug, f"v{i}", now=t0 + 61 + i) for i in range(10)]
    assert all(t.status == store.TicketStatus.WAITING for t in prequeue)
    assert services.queue_tick(slug=slug, now=t0 + 100).admitted == []  # type: ignore[union-attr]  # not started
    record = QueueShuffle.objects.get(queue=sale)
    assert record.revealed_at is None and record.commitment == shuffle.commitment_of(record.seed)

    # Before the tick does the shuffle, a freed slot admits nobody: the order is not the one to follow.
    assert services.queue_admit(slug=slug, now=t0 + 120.5).admitted == []

    reply = services.queue_tick(slug=slug, now=t0 + 121)  # on time: the first tick after the start
    assert reply is not None
    record.refresh_from_db()
    assert record.revealed_at is not None
    expected = shuffle.shuffle_order(record.seed, sorted((t.seq, 0) for t in prequeue))
    assert record.order == expected and sorted(record.order) == sorted(t.seq for t in prequeue)
    by_seq = {t.seq: t for t in prequeue}
    assert [a.ticket_id for a in reply.admitted] == [by_seq[s].ticket_id for s in expected[:3]]
    for place, seq in enumerate(expected[3:]):  # the rest wait in the shuffled order
        assert status(slug, by_seq[seq], now=t0 + 122).rank == place

    later = join(slug, "late", now=t0 + 130)
    assert later.rank == 7  # behind the whole pre-queue
    # The start and its draw are in the audit log (issue 47: only the webhook said "opened by schedule").
    started = QueueChange.objects.get(queue=sale, action="scheduled_start")
    assert started.actor_label == "schedule: starts_at" and started.before == {"phase": "prequeue"}
    assert started.after == {"phase": "open", "drawn": 10, "commitment": record.commitment, "seed": record.seed}
    services.queue_tick(slug=slug, now=t0 + 131)
    assert QueueChange.objects.filter(queue=sale, action="scheduled_start").count() == 1  # once per start

    services.queue_tick(slug=slug, now=t0 + 600)  # the end: closed on time, audited, visitors told
    sale.refresh_from_db()
    assert sale.state == Queue.State.CLOSED
    assert QueueChange.objects.filter(queue=sale, actor_label="schedule: ends_at", after={"state": "closed"}).exists()
    with pytest.raises(services.QueueClosed):
        join(slug, "too-late", now=t0 + 601)
    assert status(slug, later, now=t0 + 602).status == store.TicketStatus.WAITING  # its page says closed


def test_a_sale_nobody_came_to_still_starts_and_closes_on_time_by_the_every_queue_tick(sale, clock):
    """The every-queue tick leaves a queue nobody is in alone (issue 49), but not a scheduled one: its start's
    draw and its end are the lease holder's to do, whoever is in it."""
    t0 = clock.now
    services.queues_tick(instance="schedule", now=t0 + 121)
    assert QueueChange.objects.get(queue=sale, action="scheduled_start").after["drawn"] == 0
    services.queues_tick(instance="schedule", now=t0 + 600)
    sale.refresh_from_db()
    assert sale.state == Queue.State.CLOSED


def test_priority_tickets_in_the_pre_queue_go_first_and_are_shuffled_among_themselves(sale, clock):
    t0, slug = clock.now, sale.slug
    normal = [join(slug, f"n{i}", now=t0 + 61) for i in range(5)]
    vips = [join(slug, f"p{i}", now=t0 + 62, priority=2) for i in range(3)]
    services.queue_configure(slug=slug, changes={"capacity": 1}, actor_label="tests")
    services.queue_tick(slug=slug, now=t0 + 121)
    record = QueueShuffle.objects.get(queue=sale)
    vip_seqs = {t.seq for t in vips}
    assert set(record.order[:3]) == vip_seqs and set(record.order[3:]) == {t.seq for t in normal}


def test_the_shuffle_is_reproducible_from_the_seed_and_differs_for_another():
    tickets = [(seq, 0) for seq in range(1, 201)]
    seed = shuffle.seed_new()
    assert shuffle.shuffle_order(seed, tickets) == shuffle.shuffle_order(seed, list(reversed(tickets)))
    assert shuffle.shuffle_order(seed, tickets) != shuffle.shuffle_order(shuffle.seed_new(), tickets)
    assert shuffle.shuffle_order(seed, tickets) != [seq for seq, _ in tickets]  # not the join order


def test_the_record_is_public_commitment_first_seed_after_and_verify_shuffle_checks_it(sale, clock, tmp_path):
    t0, slug = clock.now, sale.slug
    tickets = [join(slug, f"v{i}", now=t0 + 61) for i in range(6)]
    client = Client()
    before = client.get(f"/api/v1/queues/{slug}/shuffle").json()
    assert before["revealed"] is False and len(before["commitment"]) == 64 and "seed" not in before
    page = client.get(f"/q/{slug}/").content.decode()
    assert before["commitment"] in page  # the waiting page shows the fingerprint before the start
    with pytest.raises(CommandError):
        call_command("verify_shuffle", slug)  # nothing to verify before the reveal

    services.queue_tick(slug=slug, now=t0 + 121)
    after = client.get(f"/api/v1/queues/{slug}/shuffle").json()
    assert after["commitment"] == before["commitment"] and after["revealed"] is True
    assert sorted(seq for seq, _ in after["tickets"]) == sorted(t.seq for t in tickets)
    out = StringIO()
    call_command("verify_shuffle", slug, stdout=out)
    assert out.getvalue().startswith("OK:")

    published = tmp_path / "shuffle.json"
    published.write_text(json.dumps(after))
    call_command("verify_shuffle", slug, "--file", str(published), stdout=StringIO())
    tampered: dict[str, Any] = {**after, "order": list(reversed(after["order"]))}
    published.write_text(json.dumps(tampered))
    with pytest.raises(CommandError, match="order"):
        call_command("verify_shuffle", slug, "--file", str(published))
    published.write_text(json.dumps({**after, "seed": shuffle.seed_new()}))
    with pytest.raises(CommandError, match="commitment"):
        call_command("verify_shuffle", slug, "--file", str(published))


def test_the_api_and_the_page_say_when_a_sale_not_yet_open_opens(make_queue):
    opens = datetime.now(tz=UTC).replace(microsecond=0).timestamp() + 3600
    queue = make_queue(prequeue_opens_at=at(opens), starts_at=at(opens + 600))
    answer = Client().post(
        f"/api/v1/queues/{queue.slug}/join",
        data={},
        content_type="application/json",
        HTTP_X_VISITOR_ID=str(uuid.uuid4()),
    )
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "queue_not_open" and datetime.fromisoformat(error["opens_at"]).timestamp() == opens
    assert 3500 <= int(answer["Retry-After"]) <= 3600
    page = Client().get(f"/q/{queue.slug}/").content.decode()
    assert 'data-state="notyet"' in page and "has not opened yet" in page


def test_moving_the_start_commits_to_a_new_seed_and_the_schedule_must_make_sense(sale, clock):
    first = QueueShuffle.objects.get(queue=sale)
    services.queue_configure(slug=sale.slug, changes={"starts_at": at(clock.now + 300)}, actor_label="tests")
    current = QueueShuffle.objects.get(queue=sale)  # the old, unrevealed commitment is gone
    assert current.pk != first.pk and current.commitment != first.commitment
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        services.queue_configure(slug=sale.slug, changes={"ends_at": at(clock.now + 200)}, actor_label="tests")
    with pytest.raises(ValidationError):
        services.queue_configure(
            slug=sale.slug, changes={"prequeue_opens_at": at(clock.now + 400)}, actor_label="tests"
        )


@pytest.mark.usefixtures("nobody_walks_at_first")
def test_before_the_draw_nobody_has_a_place_and_everyone_is_told_the_same_wait_over_the_draw(make_queue, clock):
    """Issue 18: the pre-queue page showed "place 1, 0 ahead" and a full bar to the first joiner, who was
    then drawn anywhere. Before the start the API gives no place, says the order is drawn at the start,
    and tells every ticket the same wait: the pre-queue's middle place's as it will be at the start, ranging
    from the first place to the last."""
    t0 = clock.now
    sale = make_queue(
        capacity=100,
        outflow_per_minute=6,
        burst=1,
        presence_timeout=600,
        abandon_timeout=3600,
        prequeue_opens_at=at(t0 + 60),
        starts_at=at(t0 + 120),
    )
    slug = sale.slug
    prequeue = [join(slug, f"v{i}", now=t0 + 61 + i) for i in range(10)]
    now_ms = int((t0 + 80) * 1000)
    # A look at the line that found its first places silent: before the draw those ahead of anyone will be
    # any of the line, not its first places, so the estimate does not take them from the look.
    look = [now_ms, 10, 1, 18, 1, 1, 3, 16, 2, 2, 5, 14, 3, 3, 7, 12, 4, 4]  # (place, wait, looked at, silent)
    store.client().hset(store.queue_keys(slug).st, "lj", json.dumps(look))
    views = [
        selectors.ticket_view(slug, store.status(slug, visitor_key=_vk(t), seq=t.seq, now_ms=now_ms), now_ms=now_ms)
        for t in prequeue
    ]
    for view in views:
        body = view.payload()
        assert body["position"] is None and body["ahead"] is None
        assert body["place_drawn_at_start"] is True and body["queue_length"] == 10
        assert body["opens_in_seconds"] == 40
    told = {view.estimated_wait_seconds for view in views}
    ranges = {tuple(view.estimated_wait_range or ()) for view in views}
    assert len(told) == 1 and len(ranges) == 1  # the first joiner is told no better than the last
    (low, high), (estimate,) = ranges.pop(), told
    assert estimate is not None
    assert low == 40 <= estimate <= high  # from the start (drawn first) to the last place
    # Ten joined in the 20 s since the pre-queue opened: at that pace, thirty by the start, 40 s from now
    # (counting only the ten so far, the first joiners were told the middle of a handful). Six a minute
    # (one every 10 s) after the start's one token: the middle of thirty (15.5 admissions) about 145 s
    # after the start, the last twice that.
    assert estimate == math.ceil(40 + (15.5 - 1) * 10 + 0.5)
    assert high == math.ceil(40 + 2 * (estimate - 40))

    services.queue_tick(slug=slug, now=t0 + 121)  # the draw
    now_ms = int((t0 + 122) * 1000)
    waiting = [t for t in prequeue if status(slug, t, now=t0 + 122).status == store.TicketStatus.WAITING]
    after = selectors.ticket_view(
        slug, store.status(slug, visitor_key=_vk(waiting[0]), seq=waiting[0].seq, now_ms=now_ms), now_ms=now_ms
    ).payload()
    assert after["position"] is not None and "place_drawn_at_start" not in after


def _vk(ticket: store.TicketState) -> str:
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    return parsed[1]
