"""A client that stops reading holds nobody else up (issue 15): the websocket server (uvicorn with the
sans-I/O protocol, as runstack starts it, here in the test's own loop on a free port) waits for a full
socket's buffer to drain before it writes more; the router never waits for it (wsserver.write), keeps its
frames in order up to a bound, and then closes it, while every other socket hears each event at once."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async

from queueing import realtime, wsserver

from .factories import decode_ticket, join, ticket_token
from .wsserve import stalled_client, websocket_server

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("small_group", [100, 1], ids=["written-at-once", "by-a-writer-task"])
async def test_a_client_that_stops_reading_holds_up_no_other_socket_and_is_closed_when_too_far_behind(
    make_queue, monkeypatch, small_group
):
    from websockets.asyncio.client import connect

    monkeypatch.setattr(wsserver, "MAX_PENDING", 50)
    monkeypatch.setattr(wsserver, "SMALL_GROUP", small_group)  # its group's events: inline, or a writer's
    queue = await sync_to_async(make_queue)(state="paused")
    stalled_ticket = await sync_to_async(ticket_token)(queue.slug, await sync_to_async(join)(queue.slug, "stalled"))
    reader_ticket = await sync_to_async(ticket_token)(queue.slug, await sync_to_async(join)(queue.slug, "reader"))
    async with websocket_server() as port:
        stalled = await stalled_client(port, queue.slug, stalled_ticket)
        try:
            async with connect(
                f"ws://127.0.0.1:{port}/ws/queues/{queue.slug}/",
                origin="http://localhost",  # type: ignore[arg-type]
                max_queue=None,
            ) as reader:
                await reader.send(json.dumps({"type": "hello", "ticket": reader_ticket}))
                assert json.loads(await reader.recv())["type"] == "ready"
                router = wsserver.router()
                group = realtime.queue_group(queue.slug)
                deadline = time.monotonic() + 5
                while router.members(group) < 2:
                    assert time.monotonic() < deadline, "the stalled client never joined"
                    await asyncio.sleep(0.05)
                reader_key = (await sync_to_async(decode_ticket)(reader_ticket, slug=queue.slug)).visitor_key
                [slow] = [s for s in router.groups[group] if s.answering and s.answering.visitor_key != reader_key]
                slow_wire = slow.wire
                assert slow_wire is not None
                # Under this server, events go to the sockets' transports as frames built once (the ASGI send
                # only when a frame cannot be written at once).
                assert all(s.wire is not None for s in router.groups[group])

                # Events of 16 KB each, until the stalled client's buffers (its own, the kernel's, the server's)
                # are full, its frames have piled up to the bound and it was closed: the reader hears every one
                # of them, each soon after it was sent.
                padding = "x" * 16000
                late: list[float] = []
                most_pending, seq, paused = 0, 0, False
                while router.members(group) > 1:
                    seq += 1
                    assert seq <= 5000, f"the stalled socket was never closed (at most {most_pending} pending)"
                    sent = time.monotonic()
                    await sync_to_async(realtime.send)(
                        [(group, {"type": "queue_move", "seq": seq, "ops": [], "pad": padding})]
                    )
                    while True:
                        try:
                            event = json.loads(await asyncio.wait_for(reader.recv(), 5))
                        except TimeoutError:
                            raise AssertionError(f"no event {seq} for the reader") from None
                        if event["type"] == "queue_move":
                            break
                    assert event["seq"] == seq  # in order, none lost
                    late.append(time.monotonic() - sent)
                    most_pending = max(most_pending, len(slow.pending or ()))
                    paused = paused or slow_wire.direct is None  # its buffer full: no frame straight to it
                assert max(late) < 1.0, max(late)
                assert most_pending == wsserver.MAX_PENDING  # kept in order up to the bound, then closed
                assert paused  # while its buffer was full, nothing was written straight to it
                assert wsserver.roll_call().count(queue.slug) == 1
        finally:
            stalled.close()


# A socket's own objects. Not channels_redis: its per-loop layer of an earlier test's loop is not a socket's.
SOCKET_MODULES = ("queueing.consumers", "queueing.wsprotocol", "uvicorn.", "websockets.", "channels.")


async def test_closed_sockets_leave_no_cyclic_garbage_for_the_frozen_generation(make_queue):
    """The collector freezes long-lived objects and collects everything only when the server holds no
    sockets (wsserver.Collector): safe only while a closed socket's objects are freed by reference
    counting, leaving nothing that only a full collection could reclaim. Checked through the real server."""
    import gc

    queue = await sync_to_async(make_queue)(state="paused")
    tickets = [
        await sync_to_async(ticket_token)(queue.slug, await sync_to_async(join)(queue.slug, f"v{i}")) for i in range(40)
    ]
    async with websocket_server() as port:
        clients = [await stalled_client(port, queue.slug, ticket) for ticket in tickets]
        deadline = time.monotonic() + 10
        while wsserver.roll_call().count(queue.slug) < len(tickets):
            assert time.monotonic() < deadline, "the sockets never said hello"
            await asyncio.sleep(0.05)
        await wsserver.roll_call().call(queue.slug)
        await sync_to_async(realtime.send)(
            [(realtime.queue_group(queue.slug), {"type": "queue_move", "seq": 1, "ops": []})]
        )
        await asyncio.sleep(2.5)  # their catch-up reads are done
        gc.collect()
        gc.freeze()  # the sockets' objects, frozen as the collector freezes them
        try:
            for client in clients:
                client.close()
            while wsserver.roll_call().count(queue.slug):
                assert time.monotonic() < deadline + 10, "the sockets never closed"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
        finally:
            gc.unfreeze()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            # A socket's own objects (a server's router of an earlier test's loop is not one of them).
            ours = [o for o in gc.garbage if type(o).__module__.startswith(SOCKET_MODULES)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert ours == []
