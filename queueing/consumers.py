"""Websockets (SPEC 7). Thin: check the ticket, join the queue's group and the ticket's own group,
forward events. While a socket is open it also stands in for the visitor's polls: every
`poll_after_seconds` it takes the visitor's status (which keeps it present, so admission does not skip
it) and sends it as a `position` event, or `admitted` / `expired` when that is the news."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs

import redis
from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import realtime, selectors, store, tokens

CLOSE_INVALID_TICKET = 4401
VIEWERS_REPORT_SECONDS = 5.0


class QueueConsumer(AsyncJsonWebsocketConsumer):
    slug = ""
    claims: tokens.TicketClaims | None = None
    heartbeat: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.slug = self.scope["url_route"]["kwargs"]["slug"]
        raw = parse_qs(self.scope.get("query_string", b"").decode()).get("ticket", [""])[0]
        try:
            self.claims = tokens.ticket_decode(raw, slug=self.slug)
        except tokens.InvalidTicket:
            await self.close(code=CLOSE_INVALID_TICKET)  # before accept: the handshake is refused
            return
        for group in self._groups():
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        viewers.opened(self.slug)
        self.heartbeat = asyncio.ensure_future(self._heartbeat())

    async def disconnect(self, code: int) -> None:
        if self.claims is None:
            return
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        for group in self._groups():
            await self.channel_layer.group_discard(group, self.channel_name)
        viewers.closed(self.slug)

    async def queue_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # A client that saw a gap in the event sequence asks for the truth over the socket.
        if isinstance(content, dict) and content.get("type") == "status":
            await self._send_status()

    def _groups(self) -> list[str]:
        assert self.claims is not None
        return [realtime.queue_group(self.slug), realtime.ticket_group(self.slug, self.claims.visitor_key)]

    async def _heartbeat(self) -> None:
        await asyncio.sleep(random.uniform(1, 3))  # sockets opened together do not poll together
        while (interval := await self._send_status()) is not None:
            await asyncio.sleep(interval)

    async def _send_status(self) -> float | None:
        """Send the visitor's status; returns when to send it again, or None when the ticket is over."""
        assert self.claims is not None
        try:
            view = await sync_to_async(selectors.ticket_status_get, thread_sensitive=False)(claims=self.claims)
        except selectors.TicketGone:
            await self.send_json({"type": "expired", "ticket_id": self.claims.ticket_id, "reason": "expired"})
            return None
        except redis.RedisError:
            return 5.0  # Redis is away: the client's own polling notices; try again shortly
        if view.access_token:
            await self.send_json(
                {
                    "type": "admitted",
                    "ticket_id": view.ticket_id,
                    "access_token": view.access_token,
                    "redirect_url": view.redirect_url,
                    "expires_at": view.expires_at,
                }
            )
            return max(view.poll_after_seconds, 15.0)
        if view.is_finished:
            await self.send_json({"type": "expired", "ticket_id": view.ticket_id, "reason": view.reason})
            return None
        await self.send_json({"type": "position", **view.payload()})
        return view.poll_after_seconds


class _Viewers:
    """How many sockets this server holds per queue, reported to Redis every few seconds (the stats
    read the sum over servers). One report per server, not a write per socket."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.instance = f"{socket.gethostname()}-{os.getpid()}"
        self._task: asyncio.Task[None] | None = None

    def opened(self, slug: str) -> None:
        self.counts[slug] += 1
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.ensure_future(self._report_forever())

    def closed(self, slug: str) -> None:
        self.counts[slug] -= 1

    async def report(self) -> None:
        counts = {slug: max(0, count) for slug, count in self.counts.items()}
        if counts:
            await sync_to_async(store.viewers_report, thread_sensitive=False)(
                counts, instance=self.instance, now=time.time()
            )
        for slug, count in counts.items():
            if count == 0 and self.counts.get(slug) == 0:  # reported as zero once: stop writing it
                del self.counts[slug]

    async def _report_forever(self) -> None:
        while True:
            with contextlib.suppress(redis.RedisError):  # the next report will do
                await self.report()
            await asyncio.sleep(VIEWERS_REPORT_SECONDS)


viewers = _Viewers()
