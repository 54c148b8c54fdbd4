"""A crowd of sockets closing at once (a sale's end, a proxy's restart, a network blip) costs the websocket
server a few Redis calls in all, not one or two each (issue 51, item 2): when 5,000 sockets closed together
the server's loop stood still for 0.44 s (bench/push_bench.py --mass-close), most of it an UNSUBSCRIBE per
socket queueing on the layer's connection lock, Channels' thread hop per close, and a lease given back per
socket. Through the websocket server as runstack starts it (uvicorn, the lean sans-I/O protocol), in the
test's own loop, with real sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from queueing import realtime, store, wsserver
from queueing.services import viewers as viewer_services

from .factories import join, ticket_token
from .wsserve import stalled_client, websocket_server

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

CROWD = 120


async def _until(condition: Any, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_a_crowd_closing_at_once_gives_its_leases_back_in_a_few_calls_and_leaves_two_channels(
    make_queue, monkeypatch
):
    queue = await sync_to_async(make_queue)(state="paused")
    tickets = [
        await sync_to_async(ticket_token)(queue.slug, await sync_to_async(join)(queue.slug, f"v{i}"))
        for i in range(CROWD)
    ]
    calls: list[int] = []
    give_back = viewer_services.aviewers_close

    async def counted(slug: str, leases: Any, *, now: float) -> None:
        calls.append(len(leases))
        await give_back(slug, leases, now=now)  # the real call, counted

    monkeypatch.setattr(viewer_services, "aviewers_close", counted)
    viewers = sync_to_async(store.viewers_count)
    async with websocket_server() as port:
        sockets: list[socket.socket] = []
        try:
            for ticket in tickets:
                sockets.append(await stalled_client(port, queue.slug, ticket, reading=True))
            roll = wsserver.roll_call()
            await _until(lambda: roll.count(queue.slug) == CROWD, "the crowd never said hello")
            assert await viewers(queue.slug, now=time.time()) == CROWD
            # One channel for the queue's public events and one for all its tickets' private ones.
            assert wsserver.router().subscribed == {realtime.queue_group(queue.slug), f"private.{queue.slug}"}
        finally:
            for sock in sockets:  # all at once: nothing lets the server's loop run in between
                sock.close()
        roll = wsserver.roll_call()
        await _until(lambda: roll.count(queue.slug) == 0, "the server still holds sockets")
        await roll.given_back()
        assert sum(calls) == CROWD  # every lease given back, once
        assert len(calls) <= 3, calls  # a few calls for the crowd (one per socket: 120)
        assert await viewers(queue.slug, now=time.time()) == 0
        await _until(lambda: not wsserver.router().subscribed, "the queue's channels were not left")
