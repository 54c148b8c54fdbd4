"""A client that stops reading holds nobody else up (issue 15): the websocket server (uvicorn with the
sans-I/O protocol, as runstack starts it, here in the test's own loop on a free port) waits for a full
socket's buffer to drain before it writes more; the router never waits for it (wsserver.write), keeps its
frames in order up to a bound, and then closes it, while every other socket hears each event at once."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any

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
    sockets (wscollector.Collector): safe only while a closed socket's objects are freed by reference
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


# --- The fan-out's lanes ---------------------------------------------------------------------------------


class _Socket:
    """What the router reads of a socket (wsserver.Socket), around a real transport of a real TCP socket."""

    def __init__(self, transport: asyncio.Transport, group: str) -> None:
        self.wire = type("Wire", (), {"direct": transport})()
        self.pending: Any = None
        self.groups_joined = (group,)
        self.sent: list[Any] = []

    async def base_send(self, message: Any) -> None:
        self.sent.append(message)


async def test_a_socket_that_falls_behind_while_a_fan_out_yields_gets_the_rest_behind_its_held_frames(
    monkeypatch,
):
    """A group keeps its sockets' transports (lanes), so that a fan-out writes to transports without
    looking at each socket. A socket whose lane is lost while the fan-out yields (its frames now held behind
    a slow client's, wsserver.write) must not have the event written straight to its transport, ahead of
    the frames it holds: it gets it through write(), as does one that leaves the group (its close may be
    sent before the fan-out reaches it). One whose transport closes meanwhile is skipped."""
    monkeypatch.setattr(wsserver, "FANOUT_YIELD_EVERY", 1)
    accepted: list[asyncio.Transport] = []

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            accepted.append(transport)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
    try:
        while len(accepted) < 5:
            await asyncio.sleep(0.01)
        router, group = wsserver.router(), "wr.test.lanes"
        sockets: list[Any] = [_Socket(transport, group) for transport in accepted]  # (wsserver.Socket in part)
        for socket in sockets:
            await router.join(group, socket)
        assert list(router.groups[group].values()) == accepted and group not in router.slow
        fast, told, untold, behind, leaver = sockets
        noted: list[Any] = []

        async def meanwhile() -> None:  # while the fan-out yields after its first socket
            told.wire.direct.close()  # closed, and its protocol said so: its lane is gone, nothing to redo
            told.wire.direct = None
            router.refresh(told)
            untold.wire.direct.close()  # closed where its protocol could not say (uvicorn's own close)
            behind.pending = deque([{"type": "websocket.send", "text": "held"}])  # its client fell behind
            router.refresh(behind)
            router.leave(group, leaver)  # released (its consumer no longer told of its lane)...
            leaver.wire.direct = None  # ...then a close sent: nothing may follow the close frame
            noted.extend(router.losses[group])

        text = '{"type":"queue_move","seq":1}'
        router.writers[group] = deque([wsserver.Event(text)])
        fan_out = asyncio.ensure_future(router._write_out(group))  # its first step, then meanwhile()
        await asyncio.ensure_future(meanwhile())
        await fan_out
        assert noted == [(behind, accepted[3]), (leaver, accepted[4])]  # the closed ones are only skipped
        assert router.losses == {} and router.writers == {}
        assert router.groups[group][told] is None and router.groups[group][behind] is None
        assert list(router.slow[group]) == [told, behind]
        frame = wsserver.Event(text).frame
        assert await asyncio.wait_for(clients[0][0].readexactly(len(frame)), 5) == frame  # fast's, straight
        assert fast.sent == [] and fast.pending is None
        assert told.sent == untold.sent == [] and untold.pending is None  # closing: skipped
        # Behind: the event after the frame it held, not straight to its transport.
        assert [m["text"] for m in behind.pending] == ["held", text]
        assert [m["text"] for m in leaver.sent] == [text]  # the ASGI send, which refuses after a close
        for reader in (clients[3][0], clients[4][0]):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), 0.3)

        # The next event: the sockets without a lane through write() (told: the ASGI send), in order, with
        # a yield between them as between lanes.
        seen_at_yield: list[int] = []
        router.writers[group] = deque([wsserver.Event("next")])
        fan_out = asyncio.ensure_future(router._write_out(group))
        await asyncio.sleep(0)
        seen_at_yield.append(len(told.sent) + len(behind.pending))
        await fan_out
        assert seen_at_yield == [1 + 2]  # told's "next" written, behind's not yet
        assert [m["text"] for m in behind.pending] == ["held", text, "next"]
        assert [m["text"] for m in told.sent] == ["next"]
        for socket in sockets:
            router.leave(group, socket)
        assert group not in router.groups and group not in router.slow
    finally:
        for _, writer in clients:
            writer.close()
        server.close()
