"""Websockets (SPEC 7). Thin: check the ticket, join the queue's group and the ticket's own group,
forward events.

The ticket comes in the socket's first message, `{"type": "hello", "ticket": ...}`, not in its URL (URLs
land in proxies' access logs): the socket is accepted, and closed unless a good hello comes within
HELLO_SECONDS; `{"type": "ready"}` answers it. A ticket holds at most SOCKETS_PER_TICKET sockets at a
time over all servers (a visitor's tabs); the stats count tickets, not sockets (store/viewers.py).

While a socket is open it also stands in for the visitor's polls, so admission does not count the visitor
absent. Pushes carry every move and the admission; what is left is presence and a safety net for news a
push lost, and the server does both for all its sockets of a queue together: its roll call (_RollCall,
lua/roll_call.lua), a few hundred sockets per Redis call every ROLL_CALL_SECONDS (or more often when the
queue's presence and claim windows need it), renews their leases, sees their waiting visitors present,
and names the sockets whose ticket is no longer simply waiting; only those read their status (and send
`admitted` or `expired`). A socket reads its status itself once, just after it opens (news between the
visitor's last poll and the socket's subscription), and when its client asks. At 15,000 sockets that is
one call a second instead of 750 status reads (bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import redis
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import instruments, loopwatch, modes, ratelimit, realtime, selectors, tokens, wscollector, wsserver
from .services import viewers as viewer_services

if TYPE_CHECKING:
    from asgiref.typing import WebSocketDisconnectEvent

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
ASK_STATUS_EVERY_SECONDS = 1.0
CATCH_UP_SECONDS = (0.5, 2.0)  # when a socket reads its status after it opens (spread: a server restart)


class QueueConsumer(AsyncJsonWebsocketConsumer):
    slug = ""
    claims: tokens.VisitorClaims | None = None
    mode: modes.QueueMode[Any] = modes.TRACKED
    answering: viewer_services.Answering | None = None
    known = viewer_services.WAITING  # the roll call's last news of the ticket that this socket acted on
    pending: deque[dict[str, Any]] | None = None  # frames waiting for a slow reader (wsserver.write)
    wire: Any = None  # its protocol, when frames may go straight to its transport (wsserver.wire)
    groups_joined: tuple[str, ...] = ()

    timer: asyncio.TimerHandle | None = None  # the hello deadline, then the catch-up read (and its retries)
    greeted = False
    quiet_until = -1e9  # no status asked by the client is read before then (once a second, or limited)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Not Channels' loop: that one gives each socket a channel of the layer and a task per source of
        # messages, where here the server's router brings the events (wsserver.Router) and this socket's
        # own task (the server's) reads its client and nothing else. Released however the consumer ends
        # (Channels runs disconnect() only on a normal close), once: _release forgets the claims.
        self.scope, self.base_send, self.wire = scope, send, wsserver.wire(send)
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass
        finally:
            self._release()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch first runs close_old_connections in its one sync thread before every
        # message, serialising each socket's every event through that thread: at 2,000 sockets, half
        # the server's CPU and most of the latency (bench/RESULTS.md). These consumers never touch the
        # database in the event loop; the status read below cleans up its own thread's connection.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.slug = self.scope["url_route"]["kwargs"]["slug"]
        await self.accept()
        self.timer = asyncio.get_running_loop().call_later(HELLO_SECONDS, self._no_hello)

    def _no_hello(self) -> None:
        if not self.greeted:
            wsserver.spawn(self.close(code=CLOSE_NO_HELLO))

    async def _hello(self, content: Any) -> None:
        self.greeted = True
        if self.timer is not None:
            self.timer.cancel()
        raw = content.get("ticket") if isinstance(content, dict) and content.get("type") == "hello" else None
        try:
            claims = tokens.visitor_ticket_decode(raw if isinstance(raw, str) else "", slug=self.slug)
            mode = modes.of_claims(claims)
        except tokens.InvalidTicket:
            await self.close(code=CLOSE_INVALID_TICKET)
            return
        lease = viewer_services.SocketLease(self.slug, claims.ticket_id, uuid.uuid4().hex)
        try:
            taken = await viewer_services.aviewer_open(lease, most=SOCKETS_PER_TICKET, now=time.time())
        except redis.RedisError:
            await self.close(code=CLOSE_TRY_AGAIN_LATER)
            return
        if not taken:
            await self.close(code=CLOSE_TOO_MANY_SOCKETS)
            return
        self.claims, self.mode = claims, mode
        instruments.sockets_open().inc()  # and down again in _release, which runs once claims are set
        if isinstance(claims, tokens.TicketClaims):
            self.answering = viewer_services.Answering(lease, claims.visitor_key, claims.seq)
        else:
            self.answering = viewer_services.Answering(lease, "", 0)
        # The queue's public events and the ticket's private ones, through the server's router. A stateless
        # queue's ticket has no private events and no presence to keep: it hears the window move and asks
        # for its status (its access token) when the window reaches it.
        private = self.mode.private_group(claims)
        self.groups_joined = (realtime.queue_group(self.slug), *((private,) if private else ()))
        server = wsserver.router()
        if self.wire is not None:
            self.wire.watch = self._lane_changed
        for group in self.groups_joined:
            await server.join(group, self)
            if self.claims is None:  # dropped meanwhile (too slow for a group joined first): _release left
                return  # the groups joined so far; it joins no more, and no roll call answers for it
        await self.send_json({"type": "ready", "ticket_id": claims.ticket_id})
        if self.claims is None:
            return
        roll = wsserver.roll_call()
        roll.add(self)
        wscollector.collector.ensure()
        loopwatch.watch.ensure(roll.describe)
        if self.mode.keeps_visitors:
            self._read_later(random.uniform(*CATCH_UP_SECONDS))

    def _read_later(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(seconds, self._catch_up)

    def _catch_up(self) -> None:
        wsserver.spawn(self.send_status())

    async def websocket_disconnect(self, message: WebSocketDisconnectEvent) -> None:
        # Channels' own leaves the groups of its `groups` (none: the router's are left in _release) and
        # closes the thread's database connections through its sync thread, a thread hop per socket (a third
        # of the loop's time when 9,000 sockets closed together; no database is used in the loop).
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        self._release()

    async def drop(self, code: int) -> None:
        self._release()
        await self.close(code=code)  # waits for room in the socket's buffer (the server's send does)

    def _lane_changed(self) -> None:
        wsserver.router().refresh(self)

    def _release(self) -> None:
        if self.wire is not None:
            self.wire.watch = None  # (the protocol and this consumer would hold each other)
        if self.timer is not None:
            self.timer.cancel()
        if self.claims is None:
            return
        self.claims = None
        instruments.sockets_open().dec()
        # No Redis call of its own: a crowd closing together is a few calls for all (RollCall.discard).
        server = wsserver.router()
        for group in self.groups_joined:
            server.leave(group, self)
        wsserver.roll_call().discard(self)

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
        await self.send_status(asked=True)

    async def send_status(self, *, asked: bool = False) -> None:
        """Send the visitor's status: `position`, or `admitted` / `expired` when that is the news.

        Read in the ticket's "status" limiter, whether the client asked or the server reads it: a
        visitor's status reads are limited alike over HTTP and over any of its sockets. A read the server
        started (the catch-up, the roll call's news) that the limiter refuses is tried again when it allows:
        that news (an admission made before the socket joined its groups) comes no other way."""
        claims = self.claims
        if claims is None:
            return  # closed meanwhile
        try:
            view = await self._status(claims)
        except ratelimit.Limited as exc:
            wait = max(exc.decision.retry_after, ASK_STATUS_EVERY_SECONDS)
            self.quiet_until = time.monotonic() + wait
            if asked:
                await self.send_json({"type": "error", "code": "rate_limited", "retry_after": wait})
            elif self.claims is not None:
                self._read_later(wait + random.uniform(0, ASK_STATUS_EVERY_SECONDS))  # (sockets refused together)
            return
        except selectors.TicketGone:
            await self.send_json({"type": "expired", "ticket_id": claims.ticket_id, "reason": "expired"})
            return
        except redis.RedisError:
            return  # Redis is away: the client's own polling notices
        if self.timer is not None:  # a read to come (the catch-up, or one the limiter put off) is not needed now
            self.timer.cancel()
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
        elif view.is_finished:
            await self.send_json({"type": "expired", "ticket_id": view.ticket_id, "reason": view.reason})
        else:
            await self.send_json({"type": "position", **view.payload()})

    @staticmethod
    async def _status(claims: tokens.VisitorClaims) -> selectors.TicketView:
        """The status on this event loop (the web server's flow: one FCALL, no thread), as an HTTP poll's is.
        When Redis lost the queue's policy, or an admitted visitor's token needs signing keys not loaded
        yet, that part in a pool thread: both read the database."""
        return await modes.astatus(claims, limit_scope="status")

    def heard(self, code: int) -> bool:
        """The roll call's news of this socket's ticket: whether the socket should read its status. Once per
        change, and always for a parked visitor (the read puts it back in its place)."""
        if code == viewer_services.PARKED or code != self.known:
            self.known = code
            return True
        return False
