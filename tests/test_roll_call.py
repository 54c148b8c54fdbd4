"""A websocket server's roll call (issue 15): its sockets of a queue answered for together, a few hundred per
Redis call (lua/roll_call.lua), instead of one status read per socket every few seconds. It renews their
leases, keeps their waiting visitors present for admission, and names the sockets whose ticket has news;
only those read their status, so a push that was lost still reaches its visitor."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from queueing import consumers, modes, services, store, wsserver
from queueing.services import viewers as viewer_services
from queueing.store import TicketStatus

from .factories import join, ticket_token, visitor
from .test_consumers import next_event, no_event, open_socket

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def answering(slug: str, ticket: store.TicketState) -> viewer_services.Answering:
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    lease = viewer_services.SocketLease(slug, ticket.ticket_id, uuid.uuid4().hex)
    return viewer_services.Answering(lease, parsed[1], parsed[0])


async def test_a_roll_call_keeps_waiting_visitors_present_where_silence_would_park_them(make_queue, clock):
    queue = await sync_to_async(make_queue)(state="paused", presence_timeout=30, capacity=5, burst=5)
    called = [await sync_to_async(join)(queue.slug, f"called{i}", now=clock()) for i in range(3)]
    silent = await sync_to_async(join)(queue.slug, "silent", now=clock())
    sockets = [answering(queue.slug, ticket) for ticket in called]
    for _ in range(4):  # every 20 s for a minute: twice the presence timeout
        answer = await viewer_services.aroll_call(queue.slug, sockets, now=clock.advance(20))
        assert (answer.outcome, answer.news) == ("ok", [])  # waiting in line: no news, no status reads
        assert (answer.presence_timeout_s, answer.claim_ttl_s) == (30, 60)
    await sync_to_async(services.queue_configure)(slug=queue.slug, changes={"state": "open"})
    reply = await sync_to_async(services.queue_admit)(slug=queue.slug, now=clock.advance(1))
    assert sorted(a.ticket_id for a in reply.admitted) == sorted(t.ticket_id for t in called)
    keys = store.queue_keys(queue.slug)
    assert await sync_to_async(store.client().zscore)(keys.away, silent.ticket_id) is not None  # parked


async def test_the_roll_call_names_the_sockets_whose_ticket_has_news(make_queue, clock):
    queue = await sync_to_async(make_queue)(state="paused", presence_timeout=30, abandon_timeout=120, capacity=2)
    waiting = await sync_to_async(join)(queue.slug, "waiting", now=clock())
    admitted = await sync_to_async(join)(queue.slug, "admitted", now=clock())
    parked = await sync_to_async(join)(queue.slug, "parked", now=clock())
    gone = viewer_services.Answering(
        viewer_services.SocketLease(queue.slug, store.ticket_id(99, visitor("nobody")), "s"), visitor("nobody"), 99
    )
    stateless = viewer_services.Answering(viewer_services.SocketLease(queue.slug, "0000000007.-", "s7"), "", 0)
    await sync_to_async(services.queue_configure)(slug=queue.slug, changes={"state": "open"})
    # Only `admitted` kept polling; 'waiting' left the line for good, 'parked' went quiet and was parked.
    await sync_to_async(store.leave)(
        queue.slug, visitor_key=visitor("waiting"), seq=waiting.seq, now_ms=int(clock.advance(1) * 1000)
    )
    sockets = [answering(queue.slug, t) for t in (waiting, admitted, parked)] + [gone, stateless]
    await viewer_services.aroll_call(queue.slug, sockets[1:2], now=clock.advance(40))
    reply = await sync_to_async(services.queue_admit)(slug=queue.slug, now=clock.advance(1))
    assert [a.ticket_id for a in reply.admitted] == [admitted.ticket_id]
    answer = await viewer_services.aroll_call(queue.slug, sockets, now=clock.advance(1))
    assert answer.news == [
        (0, TicketStatus.EXPIRED),
        (1, TicketStatus.ADMITTED),
        (2, viewer_services.PARKED),
        (3, viewer_services.UNKNOWN),
    ]
    # Long silent: abandoned. The roll call reports it overdue without finishing it (cleanup does that).
    quiet = await sync_to_async(join)(queue.slug, "quiet", now=clock())
    answer = await viewer_services.aroll_call(queue.slug, [answering(queue.slug, quiet)], now=clock.advance(200))
    assert answer.news == [(0, viewer_services.OVERDUE)]


async def test_the_roll_call_renews_every_sockets_lease(make_queue, clock):
    queue = await sync_to_async(make_queue)(state="paused")
    tickets = [await sync_to_async(join)(queue.slug, f"v{i}", now=clock()) for i in range(3)]
    sockets = [answering(queue.slug, t) for t in tickets]
    for socket in sockets:
        assert await viewer_services.aviewer_open(socket.lease, most=5, now=clock())
    count = sync_to_async(store.viewers_count)
    later = clock() + store.VIEWERS_FRESH_SECONDS - 1
    assert await count(queue.slug, now=later) == 3
    await viewer_services.aroll_call(queue.slug, sockets[:2], now=later - 5)
    assert await count(queue.slug, now=later + 10) == 2  # the third was not renewed: its lease ran out
    # Redis lost the queue's policy: the leases are renewed all the same, and the caller is told.
    await sync_to_async(store.client().delete)(store.queue_keys(queue.slug).cfg)
    answer = await viewer_services.aroll_call(queue.slug, sockets[:1], now=later + 20)
    assert answer.outcome == "no_config"
    assert await count(queue.slug, now=later + 45) == 1  # the second ran out meanwhile


# --- Through a real socket --------------------------------------------------------------------------------


async def watching(slug: str, name: str) -> tuple[Any, store.TicketState]:
    """A waiting visitor's open socket, past its catch-up read, and its ticket."""
    ticket = await sync_to_async(join)(slug, name)
    communicator, ready, _ = await open_socket(slug, await sync_to_async(ticket_token)(slug, ticket))
    assert ready
    await next_event(communicator, "position")
    return communicator, ticket


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The status reads the sockets make (ticket ids)."""
    seen: list[str] = []
    astatus = modes.astatus

    async def counted(claims: Any, **kwargs: Any) -> Any:
        seen.append(claims.ticket_id)
        return await astatus(claims, **kwargs)

    monkeypatch.setattr(modes, "astatus", counted)
    return seen


async def test_an_open_socket_reads_its_status_once_and_the_roll_call_reads_none_while_nothing_changes(
    make_queue, reads
):
    queue = await sync_to_async(make_queue)(state="paused")
    ticket = await sync_to_async(join)(queue.slug, "v")
    communicator, ready, _ = await open_socket(queue.slug, await sync_to_async(ticket_token)(queue.slug, ticket))
    assert ready
    assert (await next_event(communicator, "position"))["position"] == 1  # the catch-up read
    for _ in range(3):
        assert await wsserver.roll_call().call(queue.slug) == wsserver.ROLL_CALL_SECONDS
    await no_event(communicator, "position", within=0.5)
    assert reads == [ticket.ticket_id]
    await communicator.disconnect()


async def test_an_admission_whose_push_was_lost_reaches_the_socket_through_the_roll_call(make_queue, reads):
    queue = await sync_to_async(make_queue)(state="paused", capacity=1)
    communicator, ticket = await watching(queue.slug, "v")
    consumer: Any = next(iter(wsserver.roll_call().members[queue.slug]))
    # The push is lost: the socket is no longer subscribed to its ticket's events.
    assert consumer.claims is not None
    wsserver.router().leave(consumer.mode.private_group(consumer.claims), consumer)
    await sync_to_async(services.queue_configure)(slug=queue.slug, changes={"state": "open"})
    await sync_to_async(services.queue_admit)(slug=queue.slug)
    await no_event(communicator, "admitted", within=0.5)
    await wsserver.roll_call().call(queue.slug)
    admitted = await next_event(communicator, "admitted", timeout=3)
    assert admitted["ticket_id"] == ticket.ticket_id and admitted["access_token"]
    await wsserver.roll_call().call(queue.slug)  # told once: the next roll call reads nothing more
    await asyncio.sleep(0.2)
    assert reads == [ticket.ticket_id, ticket.ticket_id]
    await communicator.disconnect()


async def test_a_parked_visitor_whose_socket_is_open_gets_its_place_back_at_the_next_roll_call(
    make_queue, clock, monkeypatch
):
    queue = await sync_to_async(make_queue)(state="paused", presence_timeout=30)
    ahead = await sync_to_async(join)(queue.slug, "ahead", now=clock.advance(-100))  # silent for 100 s
    behind = await sync_to_async(join)(queue.slug, "behind", now=clock())
    await sync_to_async(services.queue_configure)(slug=queue.slug, changes={"state": "open"})
    await sync_to_async(services.queue_admit)(slug=queue.slug)
    keys = store.queue_keys(queue.slug)
    client = store.client()
    assert await sync_to_async(store.line_count)(queue.slug) == 0  # both absent: parked, nobody admitted
    monkeypatch.setattr(consumers.QueueConsumer, "_catch_up", lambda self: None)  # only the roll call reads
    communicator, ready, _ = await open_socket(queue.slug, await sync_to_async(ticket_token)(queue.slug, ahead))
    assert ready
    await wsserver.roll_call().call(queue.slug)
    position = await next_event(communicator, "position", timeout=3)
    assert position["position"] == 1
    assert await sync_to_async(store.line_members)(queue.slug) == [ahead.ticket_id]
    assert await sync_to_async(client.zscore)(keys.away, behind.ticket_id) is not None  # no socket: still away
    await communicator.disconnect()


async def test_roll_calls_go_in_batches_and_as_often_as_the_queues_windows_need(make_queue, monkeypatch):
    queue = await sync_to_async(make_queue)(state="paused", presence_timeout=9, claim_ttl=60)
    monkeypatch.setattr(wsserver, "ROLL_CALL_SOCKETS", 2)
    calls: list[int] = []
    aroll_call = viewer_services.aroll_call

    async def counted(slug: str, sockets: Any, **kwargs: Any) -> Any:
        calls.append(len(sockets))
        return await aroll_call(slug, sockets, **kwargs)

    monkeypatch.setattr(viewer_services, "aroll_call", counted)
    opened = []
    for i in range(5):
        ticket = await sync_to_async(join)(queue.slug, f"v{i}")
        opened.append((await open_socket(queue.slug, await sync_to_async(ticket_token)(queue.slug, ticket)))[0])
    assert await wsserver.roll_call().call(queue.slug) == 3.0  # a third of the presence timeout
    assert calls == [2, 2, 1]
    for communicator in opened:
        await communicator.disconnect()
    assert queue.slug not in wsserver.roll_call().members and queue.slug not in wsserver.roll_call().tasks


async def test_a_roll_call_after_redis_lost_the_policy_has_one_socket_restore_it(make_queue):
    queue = await sync_to_async(make_queue)(state="paused")
    communicator, _ = await watching(queue.slug, "v")
    keys = store.queue_keys(queue.slug)
    await sync_to_async(store.client().delete)(keys.cfg)
    await wsserver.roll_call().call(queue.slug)
    await next_event(communicator, "position", timeout=3)  # its read went through the database
    assert await sync_to_async(store.client().exists)(keys.cfg)
    assert (await wsserver.roll_call().call(queue.slug)) == wsserver.ROLL_CALL_SECONDS
    await communicator.disconnect()


async def test_an_admission_the_socket_was_pushed_is_not_read_again_by_the_roll_call(make_queue, reads):
    queue = await sync_to_async(make_queue)(state="paused", capacity=1)
    communicator, ticket = await watching(queue.slug, "v")
    await sync_to_async(services.queue_configure)(slug=queue.slug, changes={"state": "open"})
    await sync_to_async(services.queue_admit)(slug=queue.slug)
    assert (await next_event(communicator, "admitted"))["ticket_id"] == ticket.ticket_id
    await wsserver.roll_call().call(queue.slug)  # it hears the ticket was admitted: told already
    await no_event(communicator, "admitted", within=0.5)
    assert reads == [ticket.ticket_id]  # the catch-up read only
    await communicator.disconnect()
