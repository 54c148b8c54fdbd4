"""Websockets (SPEC 7). Thin: check the ticket, join the queue's group and the ticket's own group,
forward events.

The ticket comes in the socket's first message, `{"type": "hello", "ticket": ...}`, not in its URL (URLs
land in proxies' access logs): the socket is accepted, and closed unless a good hello comes within
HELLO_SECONDS; `{"type": "ready"}` answers it. A ticket holds at most SOCKETS_PER_TICKET sockets at a
time over all servers (a visitor's tabs); the stats count tickets, not sockets (store/viewers.py).

While a socket is open it also stands in for the visitor's polls: now and then it takes
the visitor's status (which keeps it present, so admission does not skip it) and sends it as a
`position` event, or `admitted` / `expired` when that is the news.

How often: pushes already carry every move and the admission, so the socket's status is a safety net
and a presence heartbeat, not the way news arrives. It comes every SOCKET_STATUS_SECONDS (±20%), or
more often when the queue's presence and claim windows need it (`heartbeat_ceiling_seconds`), never
more often than an HTTP poller would be told to poll. At 5,000 sockets that is ~250 status reads a
second instead of up to 2,500 (bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
import uuid
from typing import Any

import redis
from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from . import modes, ratelimit, realtime, selectors, signing_keys, tokens
from .services import viewers as viewer_services

CLOSE_MESSAGE_TOO_BIG = 1009  # RFC 6455's own code
CLOSE_TRY_AGAIN_LATER = 1013  # Redis is away: the page polls meanwhile and reconnects
CLOSE_INVALID_TICKET = 4401
CLOSE_NO_HELLO = 4408
CLOSE_TOO_MANY_SOCKETS = 4429
HELLO_SECONDS = 5.0
SOCKETS_PER_TICKET = 5
# A client only ever says hello (a ticket of a few hundred bytes) or asks for its status. uvicorn refuses
# bigger frames first (--ws-max-size, runstack.py); this holds whatever server runs the app.
MAX_MESSAGE_CHARS = 4096
VIEWERS_REPORT_SECONDS = 15.0  # lease renewals; well within store.VIEWERS_FRESH_SECONDS
SOCKET_STATUS_SECONDS = 20.0
FANOUT_YIELD_EVERY = 100
ASK_STATUS_EVERY_SECONDS = 1.0


class QueueConsumer(AsyncJsonWebsocketConsumer):
    slug = ""
    claims: tokens.VisitorClaims | None = None
    mode: modes.QueueMode[Any] = modes.TRACKED
    heartbeat: asyncio.Task[None] | None = None
    asked_at = -1e9

    lease: viewer_services.SocketLease | None = None
    hello_timer: asyncio.Task[None] | None = None
    greeted = False
    quiet_until = -1e9  # no status asked by the client is read before then (once a second, or limited)

    async def connect(self) -> None:
        self.slug = self.scope["url_route"]["kwargs"]["slug"]
        await self.accept()
        self.hello_timer = asyncio.ensure_future(self._hello_deadline())

    async def _hello_deadline(self) -> None:
        await asyncio.sleep(HELLO_SECONDS)
        if not self.greeted:
            await self.close(code=CLOSE_NO_HELLO)

    async def _hello(self, content: Any) -> None:
        self.greeted = True
        raw = content.get("ticket") if isinstance(content, dict) and content.get("type") == "hello" else None
        try:
            claims = tokens.visitor_ticket_decode(raw if isinstance(raw, str) else "", slug=self.slug)
            mode = modes.of_claims(claims)
        except tokens.InvalidTicket:
            await self.close(code=CLOSE_INVALID_TICKET)
            return
        lease = viewer_services.SocketLease(self.slug, claims.ticket_id, uuid.uuid4().hex)
        try:
            taken = await sync_to_async(viewer_services.viewer_open, thread_sensitive=False)(
                lease, most=SOCKETS_PER_TICKET, now=time.time()
            )
        except redis.RedisError:
            await self.close(code=CLOSE_TRY_AGAIN_LATER)
            return
        if not taken:
            await self.close(code=CLOSE_TOO_MANY_SOCKETS)
            return
        self.claims, self.mode, self.lease = claims, mode, lease
        viewers.opened(lease)
        # Private events come through this consumer's own channel; the queue's public ones through the
        # server's one listener for the queue (_PublicFanout), which writes them to every socket.
        # A stateless queue's ticket has no private events and no presence to keep: it hears the window
        # move and asks for its status (its access token) when the window reaches it.
        if self.mode.keeps_visitors:
            await self.channel_layer.group_add(self.mode.private_group(self.claims), self.channel_name)
        await self.send_json({"type": "ready", "ticket_id": claims.ticket_id})
        _fanout().add(self.slug, self, self.channel_layer)
        collector.ensure()
        if self.mode.keeps_visitors:
            self.heartbeat = asyncio.ensure_future(self._heartbeat())

    async def disconnect(self, code: int) -> None:
        await self._release()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Channels runs disconnect() only when the socket closes normally; anything else escaping a
        # handler would leave the viewer counted, the consumer in the fan-out and its heartbeat reading
        # Redis for good. Released here whatever ends the consumer (once: _release forgets the claims).
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def _release(self) -> None:
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        if self.claims is None:
            return
        group = self.mode.private_group(self.claims)
        self.claims = None
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        _fanout().discard(self.slug, self)
        if self.lease is not None:
            await viewers.closed(self.lease)
        if group:
            with contextlib.suppress(Exception):  # the layer's subscription ends with the consumer anyway
                await self.channel_layer.group_discard(group, self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch first runs close_old_connections in its one sync thread before every
        # message, serialising each socket's every event through that thread: at 2,000 sockets, half
        # the server's CPU and most of the latency (bench/RESULTS.md). These consumers never touch the
        # database in the event loop; the status read below cleans up its own thread's connection.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def queue_event(self, message: dict[str, Any]) -> None:
        await self.send(text_data=message["text"])  # encoded once by realtime.send for every socket

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        # A client says hello, then at most {"type": "status"}: anything big is refused outright, binary
        # frames and text that is not JSON are ignored (Channels' JSON consumer would raise, ending the
        # consumer without its disconnect).
        if len(text_data or bytes_data or "") > MAX_MESSAGE_CHARS:
            await self.close(code=CLOSE_MESSAGE_TOO_BIG)
            return
        if not text_data:
            return
        try:
            content = await self.decode_json(text_data)
        except ValueError:
            content = None
        if not self.greeted:
            await self._hello(content)
        elif content is not None:
            await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # A client that saw a gap in the event sequence asks for the truth over the socket. Each answer is
        # a Redis call, counted by the ticket's "status" limiter as an HTTP poll is; this socket asks Redis
        # at most once a second, and not at all while the limiter refuses.
        if self.claims is None or not (isinstance(content, dict) and content.get("type") == "status"):
            return
        now = time.monotonic()
        if now < self.quiet_until:
            return
        self.quiet_until = now + ASK_STATUS_EVERY_SECONDS
        await self._send_status(asked=True)

    async def _heartbeat(self) -> None:
        await asyncio.sleep(random.uniform(1, 3))  # sockets opened together do not poll together
        while (interval := await self._send_status()) is not None:
            await asyncio.sleep(interval)

    async def _send_status(self, *, asked: bool = False) -> float | None:
        """Send the visitor's status; returns when to send it again, or None when the ticket is over.

        Read in the ticket's "status" limiter, whether the client asked or the heartbeat reads it: a
        visitor's status reads are limited alike over HTTP and over any of its sockets."""
        assert self.claims is not None
        try:
            view = await self._status()
        except ratelimit.Limited as exc:
            wait = max(exc.decision.retry_after, ASK_STATUS_EVERY_SECONDS)
            self.quiet_until = time.monotonic() + wait
            if asked:
                await self.send_json({"type": "error", "code": "rate_limited", "retry_after": wait})
            return wait
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
        return socket_status_after(view)


    async def _status(self) -> selectors.TicketView:
        """The status on this event loop (the web server's plan: one FCALL, no thread), as an HTTP poll's is.
        When Redis lost the queue's policy, or an admitted visitor's token needs signing keys not loaded
        yet, in a pool thread: both read the database (whose stale connection that thread then closes)."""
        assert self.claims is not None
        try:
            return await modes.astatus(self.claims, limit_scope="status")
        except (selectors.PolicyMissing, signing_keys.KeysNotLoaded):
            pass
        return await database_sync_to_async(modes.status, thread_sensitive=False)(self.claims, limit_scope="status")


def socket_status_after(view: selectors.TicketView) -> float:
    """Seconds until a waiting socket's next status (see the module's docstring)."""
    wanted = min(SOCKET_STATUS_SECONDS, view.heartbeat_ceiling_seconds) * random.uniform(0.8, 1.0)
    return max(view.poll_after_seconds, wanted)


class _PublicFanout:
    """A queue's public events (`queue_move`, `snapshot`), written by one listener per queue and server
    straight to each of the server's sockets for that queue.

    Through the channel layer, each socket would be a member of the queue's group: one delivery to the
    server still, but then a queue, a task wake-up and a dispatch per socket per event. Writing the
    event's text (encoded once by realtime.send) to each socket in one loop is about four times cheaper
    at 5,000 sockets (bench/RESULTS.md). Writes do not wait for slow clients (the server buffers them).
    """

    def __init__(self) -> None:
        self.members: dict[str, set[QueueConsumer]] = {}
        self.listeners: dict[str, asyncio.Task[None]] = {}

    def add(self, slug: str, consumer: QueueConsumer, layer: Any) -> None:
        self.members.setdefault(slug, set()).add(consumer)
        listener = self.listeners.get(slug)
        if listener is None or listener.done():
            self.listeners[slug] = asyncio.ensure_future(self._listen(slug, layer))

    def discard(self, slug: str, consumer: QueueConsumer) -> None:
        members = self.members.get(slug)
        if members is None:
            return
        members.discard(consumer)
        if not members:
            del self.members[slug]
            listener = self.listeners.pop(slug, None)
            if listener is not None:
                listener.cancel()

    async def _listen(self, slug: str, layer: Any) -> None:
        group = realtime.queue_group(slug)
        channel = await layer.new_channel("fanout.")
        await layer.group_add(group, channel)
        try:
            while True:
                message = await layer.receive(channel)  # cancelling this unsubscribes the channel
                frame: Any = {"type": "websocket.send", "text": message["text"]}
                for index, consumer in enumerate(list(self.members.get(slug, ()))):
                    if index and index % FANOUT_YIELD_EVERY == 0:
                        await asyncio.sleep(0)  # let private events (an admission) through meanwhile
                    with contextlib.suppress(Exception):  # a socket closing now: its disconnect follows
                        await consumer.base_send(frame)
        finally:
            with contextlib.suppress(Exception):
                await layer.group_discard(group, channel)


_fanouts: dict[asyncio.AbstractEventLoop, _PublicFanout] = {}


def _fanout() -> _PublicFanout:
    """The running event loop's fan-out (one per server; tests run several loops one after another)."""
    loop = asyncio.get_running_loop()
    fanout = _fanouts.get(loop)
    if fanout is None:
        for old in [old for old in _fanouts if old.is_closed()]:
            del _fanouts[old]
        fanout = _fanouts[loop] = _PublicFanout()
    return fanout


class _Collector:
    """Keeps Python's full garbage collections short in a server holding thousands of sockets.

    Each socket is some hundred long-lived objects (consumer, tasks, coroutines, queues); at 5,000
    sockets a full collection walks them all and stops the event loop for 0.4-0.7 s, every few seconds
    while sockets come and go (bench/RESULTS.md). Every WR_WS_GC_FREEZE_SECONDS the survivors are moved
    out of the collector's sight (gc.freeze), so automatic collections only walk what is newer; every
    WR_WS_GC_FULL_SECONDS one full collection over everything reclaims cyclic garbage among them.
    Plain (acyclic) garbage, most of a closed socket, is freed by reference counting as always.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        if settings.WR_WS_GC_FREEZE_SECONDS <= 0:
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.ensure_future(self._run())

    @staticmethod
    def cycle(*, full: bool) -> None:
        if full:
            gc.unfreeze()
            gc.collect()
        gc.freeze()

    async def _run(self) -> None:
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(settings.WR_WS_GC_FREEZE_SECONDS)
            full = time.monotonic() - last_full >= settings.WR_WS_GC_FULL_SECONDS
            self.cycle(full=full)
            if full:
                last_full = time.monotonic()


collector = _Collector()


class _Viewers:
    """The leases (store/viewers.py) of the sockets this server holds: each taken when its socket says
    hello and given back when it closes; all renewed together every VIEWERS_REPORT_SECONDS."""

    def __init__(self) -> None:
        self.leases: set[viewer_services.SocketLease] = set()
        self._task: asyncio.Task[None] | None = None

    def count(self, slug: str) -> int:
        return sum(1 for lease in self.leases if lease.slug == slug)

    def opened(self, lease: viewer_services.SocketLease) -> None:
        self.leases.add(lease)
        if self._task is None or self._task.done() or self._task.get_loop() is not asyncio.get_running_loop():
            self._task = asyncio.ensure_future(self._report_forever())

    async def closed(self, lease: viewer_services.SocketLease) -> None:
        self.leases.discard(lease)
        with contextlib.suppress(redis.RedisError):  # then its lease runs out on its own
            await sync_to_async(viewer_services.viewer_close, thread_sensitive=False)(lease, now=time.time())

    async def report(self) -> None:
        if self.leases:
            await sync_to_async(viewer_services.viewers_report, thread_sensitive=False)(
                list(self.leases), now=time.time()
            )

    async def _report_forever(self) -> None:
        while True:
            await asyncio.sleep(VIEWERS_REPORT_SECONDS)
            with contextlib.suppress(redis.RedisError):  # the next report will do
                await self.report()


viewers = _Viewers()
