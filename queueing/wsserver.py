"""What one websocket server shares among its sockets (consumers.py holds one socket's part): the router
that brings every event to them, and the roll calls that answer for them in Redis (wscollector.py keeps
Python's garbage collection short over thousands of them).

Each is one object per server (per event loop: tests run several loops one after another), found with
`router()` and `roll_call()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Generator
from typing import Any, Protocol

import redis
from channels.layers import get_channel_layer

from . import instruments, realtime, selectors
from .services import viewers as viewer_services
from .wsprotocol import LeanSansIOProtocol, PerLoop

logger = logging.getLogger(__name__)

FANOUT_YIELD_EVERY = 250  # sockets written between two yields of a fan-out (~3 ms)
SMALL_GROUP = 100  # groups up to this size are written at once, bigger ones by a writer task
MAX_PENDING = 200  # frames kept for a socket whose client reads too slowly; past this it is closed
ROLL_CALL_SECONDS = 15.0  # lease renewals (well within store.VIEWERS_FRESH_SECONDS) and presence
ROLL_CALL_SOCKETS = 250  # per Redis call: ~1-2 ms of Redis each
READS_AT_ONCE = 16  # status reads the roll call's news starts at a time
CLOSE_TOO_SLOW = 1013  # try again later: its page polls meanwhile and reconnects


class Socket(Protocol):
    """What the server's machinery needs of a socket (consumers.QueueConsumer)."""

    slug: str
    answering: viewer_services.Answering | None  # its lease, and what it answers for in the roll call
    pending: deque[dict[str, Any]] | None  # frames waiting for a slow reader, oldest first
    known: int  # the ticket status its visitor was last told of (roll_call.lua's codes)
    wire: LeanSansIOProtocol | None  # its protocol, when frames may go straight to its transport (wire())
    groups_joined: tuple[str, ...]  # the router's groups it is in

    base_send: Any  # the server's ASGI send

    async def drop(self, code: int) -> None:
        """Stop serving it (its client reads too slowly), and close it once its buffer lets a close through."""

    async def send_status(self, *, asked: bool = False) -> None: ...

    def heard(self, code: int) -> bool: ...


# --- Writing without waiting for anyone ------------------------------------------------------------------


class Event:
    """An event's text, and its websocket frame as a server sends it, built once for every socket."""

    __slots__ = ("_frame", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._frame: bytes | None = None

    @property
    def frame(self) -> bytes:
        if self._frame is None:
            payload = self.text.encode()
            n = len(payload)
            if n < 126:
                head = bytes((0x81, n))
            elif n < 65536:
                head = bytes((0x81, 126)) + n.to_bytes(2, "big")
            else:
                head = bytes((0x81, 127)) + n.to_bytes(8, "big")
            self._frame = head + payload  # a final text frame, unmasked (RFC 6455 5.2), uncompressed
        return self._frame


def wire(send: Any) -> LeanSansIOProtocol | None:
    """For the websocket server runstack starts (uvicorn, wsprotocol.py's form of its sans-I/O protocol): the
    protocol whose ASGI `send` this is, whose `direct` is its transport while a frame may be written to it
    straight (answered, its buffer not full, no close sent). For any other server None: the ASGI send.

    Writing the event's frame, built once, to each socket's transport costs a third of what the ASGI send
    does, which frames the text again for every socket (bench/RESULTS.md)."""
    protocol = getattr(send, "__self__", None)
    if isinstance(protocol, LeanSansIOProtocol) and getattr(send, "__func__", None) is LeanSansIOProtocol.send:
        return protocol
    return None


def lane(socket: Socket) -> Any:
    """The transport a frame for this socket may be written to straight (write()'s common case), or None."""
    return socket.wire.direct if socket.wire is not None and socket.pending is None else None


def write(socket: Socket, event: Event) -> None:
    """Write an event to a socket without waiting for it.

    The frame goes straight to the socket's transport when it can (wire()). Otherwise the ASGI send,
    which waits while the client's buffer is full (a client that stopped reading): awaited in a fan-out,
    one such client would hold every other socket's events behind it. So the send is started here and, in
    the common case, finishes at once. Only when it has to wait does the rest run in a task of its own,
    and later frames for that socket queue behind it in order; a socket that falls MAX_PENDING frames
    behind is dropped (its page polls meanwhile and reconnects)."""
    if socket.pending is None:
        transport = socket.wire.direct if socket.wire is not None else None
        if transport is not None and not transport.is_closing():
            transport.write(event.frame)
            return
        message = {"type": "websocket.send", "text": event.text}
        started = _start(socket.base_send(message))
        if started is not None:
            socket.pending = deque()
            router().refresh(socket)
            spawn(_drain(socket, *started))
    elif len(socket.pending) >= MAX_PENDING:
        socket.pending = deque(maxlen=0)  # nothing more is kept for it
        spawn(socket.drop(CLOSE_TOO_SLOW))
    else:
        socket.pending.append({"type": "websocket.send", "text": event.text})


def _start(awaitable: Awaitable[None]) -> tuple[Generator[Any, None, None], Any] | None:
    """Run a send up to its first wait: None when it finished (or failed: a socket closing), else the
    coroutine and what it waits for."""
    coroutine: Any = awaitable.__await__()
    try:
        waiting = coroutine.send(None)
    except StopIteration:
        return None
    except Exception:  # the socket is closing; its disconnect follows
        return None
    return coroutine, waiting


async def _resume(coroutine: Generator[Any, None, None], waiting: Any) -> None:
    """Finish a coroutine started by _start, as a task would have: wake when what it waits for is done,
    then let it go on (it reads that future's result itself). The future is not awaited a second time: it
    was handed out once already (asyncio refuses a second await of a future it is blocked on)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            if waiting is None:
                await asyncio.sleep(0)  # a bare yield
            else:
                woken = loop.create_future()
                waiting.add_done_callback(lambda _done, woken=woken: woken.done() or woken.set_result(None))
                await woken
            try:
                waiting = coroutine.send(None)
            except StopIteration:
                return
    except BaseException:
        coroutine.close()
        raise


async def _drain(socket: Socket, coroutine: Generator[Any, None, None], waiting: Any) -> None:
    try:
        await _resume(coroutine, waiting)
        while socket.pending:
            await socket.base_send(socket.pending.popleft())
    except Exception:  # the socket is closing; its disconnect follows
        logger.debug("a slow socket's sends ended early", exc_info=True)
    finally:
        socket.pending = None
        router().refresh(socket)


_tasks: set[asyncio.Future[Any]] = set()  # tasks started and not awaited, held until they end


def spawn(awaitable: Awaitable[Any]) -> None:
    """Run it in a task of its own, held until it ends (the loop keeps only weak references to tasks).
    Its outcome is read when it ends: a write to a client that has gone (uvicorn's ClientDisconnected, an
    OSError: a status sent as its visitor closed) is that visitor's leaving, and says nothing; any other
    failure is logged once. Unread, asyncio logged each as "Task exception was never retrieved" with its
    traceback, an error per socket of a crowd that closed during its catch-up, and a handler that keeps
    records kept the consumer and its socket alive through the traceback's frames."""
    task = asyncio.ensure_future(awaitable)
    _tasks.add(task)
    task.add_done_callback(_ended)


def _ended(task: asyncio.Future[Any]) -> None:
    _tasks.discard(task)
    if task.cancelled():
        return
    failure = task.exception()
    if failure is not None and not isinstance(failure, OSError):
        logger.error("a socket's task failed", exc_info=failure)


# --- The router -----------------------------------------------------------------------------------------


class Router:
    """Every event this server's sockets hear comes through one channel of the layer: the server's, added
    to each group (a queue's public events, a ticket's private ones) that one of its sockets listens to,
    and read by one task. A socket is no channel and no task of its own (through Channels each would be
    a channel, its queue and a task waiting on it; bench/RESULTS.md).

    The event's group comes in its envelope (realtime.encoded). A small group's sockets (a ticket's tabs)
    are written at once; a big one's (a queue watched by thousands) by a writer task of the group, in
    order, yielding every FANOUT_YIELD_EVERY sockets so that a private event (an admission) is not held
    behind a fan-out. No write waits for a slow client (write()).

    Each group keeps its sockets with their lanes (lane(): the transport a frame goes to straight, or None),
    and apart those without one (`slow`), brought up to date as they change (refresh(), from the protocol's
    `watch` and a slow socket's frames held and drained). A fan-out then writes to a list of transports,
    as the framework-free reference does, without reading each socket's objects: reading them was a third
    of its time over the writes themselves at 8,000 sockets (bench/RESULTS.md). A socket that loses its lane
    while its group's fan-out runs, its transport not closing (its client reads too slowly, the server
    sent a close), or that leaves the group then, is noted in that fan-out's `losses`; when it yields, the
    fan-out writes such a socket's event through write() (behind the frames it holds, or not at all after
    a close), as it did before lanes. A lane whose transport closes is only skipped.
    """

    def __init__(self) -> None:
        self.groups: dict[str, dict[Socket, Any]] = {}  # group -> its sockets -> their lanes
        self.slow: dict[str, dict[Socket, None]] = {}  # group -> its sockets without a lane
        self.losses: dict[str, list[tuple[Socket, Any]]] = {}  # group -> lanes lost since its fan-out's event began
        self.hearing: Counter[str] = Counter()  # the layer's groups wanted: how many groups here are heard through each
        self.subscribed: set[str] = set()  # the layer's groups the server's channel is in
        self.syncing: set[str] = set()
        self.writers: dict[str, deque[Event]] = {}  # a big group's events not yet written, and its writer runs
        self.channel = ""
        self.layer: Any = None
        self.listener: asyncio.Task[None] | None = None
        self.starting = asyncio.Lock()

    def members(self, group: str) -> int:
        return len(self.groups.get(group, ()))

    async def join(self, group: str, socket: Socket) -> None:
        if group not in self.groups:
            self.hearing[realtime.heard_through(group)] += 1
        self._lane(group, socket, lane(socket))
        await self._listening()
        await self._sync(realtime.heard_through(group))

    def _lane(self, group: str, socket: Socket, now: Any) -> None:
        self.groups.setdefault(group, {})[socket] = now
        if now is None:
            self.slow.setdefault(group, {})[socket] = None
        else:
            self._fast(group, socket)

    def _fast(self, group: str, socket: Socket) -> None:
        slow = self.slow.get(group)
        if slow is not None and socket in slow:
            del slow[socket]
            if not slow:
                del self.slow[group]

    def refresh(self, socket: Socket) -> None:
        """The socket's lane changed (or may have): keep it in its groups."""
        now = lane(socket)
        for group in socket.groups_joined:
            members = self.groups.get(group)
            if members is None or socket not in members:
                continue
            before = members[socket]
            self._lane(group, socket, now)
            if now is None and before is not None:
                self._lost(group, socket, before)

    def _lost(self, group: str, socket: Socket, transport: Any) -> None:
        losses = self.losses.get(group)
        if losses is not None and not transport.is_closing():
            losses.append((socket, transport))

    def leave(self, group: str, socket: Socket) -> None:
        """Nothing here for the socket in the group any more. No Redis call but for the last socket of a
        queue here: the layer's group it was heard through is left then, in a task of its own."""
        members = self.groups.get(group)
        if members is None or socket not in members:
            return
        before = members.pop(socket)
        self._fast(group, socket)
        if before is not None:  # a fan-out's event may have it still to write: its close may come first
            self._lost(group, socket, before)
        if not members:
            del self.groups[group]
            through = realtime.heard_through(group)
            self.hearing[through] -= 1
            if self.hearing[through] <= 0:
                del self.hearing[through]
                spawn(self._unsync(through))

    async def _unsync(self, through: str) -> None:
        with contextlib.suppress(Exception):  # Redis away: the subscription goes with the connection
            await self._sync(through)

    async def _listening(self) -> None:
        async with self.starting:  # sockets say hello together: one channel, one listener
            if self.listener is None or self.listener.done():
                self.layer = get_channel_layer()
                self.channel = await self.layer.new_channel("server.")
                self.subscribed.clear()
                self.listener = asyncio.ensure_future(self._listen(self.channel))

    async def _sync(self, group: str) -> None:
        """Bring the channel's membership of the layer's `group` in line with whether a socket here listens
        to a group heard through it. One sync per group at a time: it looks again after each change, so joins
        and leaves meanwhile count."""
        if group in self.syncing:
            return
        self.syncing.add(group)
        try:
            while (wanted := group in self.hearing) != (group in self.subscribed):
                if wanted:
                    await self.layer.group_add(group, self.channel)
                    self.subscribed.add(group)
                else:
                    self.subscribed.discard(group)
                    await self.layer.group_discard(group, self.channel)
        finally:
            self.syncing.discard(group)

    async def _listen(self, channel: str) -> None:
        while True:
            message = await self.layer.receive(channel)
            group, text = message.get("group"), message.get("text")
            members = self.groups.get(group) if isinstance(group, str) else None
            if not members or not isinstance(text, str):
                continue  # nobody here any more, or not an event of this release: polling covers it
            event = Event(text)
            instruments.pushed(text, len(members))
            backlog = self.writers.get(group)
            if backlog is not None:
                backlog.append(event)
            elif len(members) > SMALL_GROUP:
                self.writers[group] = deque([event])
                spawn(self._write_out(group))
            else:
                known = message.get("known")
                for socket in list(members):
                    write(socket, event)
                    if isinstance(known, int):
                        socket.known = known  # told: the roll call need not read it (RollCall.call)

    async def _write_out(self, group: str) -> None:
        backlog, losses = self.writers[group], self.losses.setdefault(group, [])
        try:
            while backlog:
                event = backlog.popleft()
                frame, lanes, where = event.frame, list(self.groups.get(group, {}).values()), None
                losses.clear()
                slow = list(self.slow.get(group, ()))
                for start in range(0, len(slow), FANOUT_YIELD_EVERY):
                    if start:
                        await asyncio.sleep(0)
                    for socket in slow[start : start + FANOUT_YIELD_EVERY]:
                        write(socket, event)
                for start in range(0, len(lanes), FANOUT_YIELD_EVERY):
                    if start or slow:
                        await asyncio.sleep(0)
                    if losses:  # sockets that lost their lanes (or left) meanwhile: through write()
                        where = where or {transport: at for at, transport in enumerate(lanes) if transport is not None}
                        self._lost_since(losses, lanes, where, start, event)
                    for transport in lanes[start : start + FANOUT_YIELD_EVERY]:
                        if transport is not None and not transport.is_closing():
                            transport.write(frame)
        finally:
            del self.writers[group]
            del self.losses[group]

    @staticmethod
    def _lost_since(
        losses: list[tuple[Socket, Any]], lanes: list[Any], where: dict[Any, int], start: int, event: Event
    ) -> None:
        """Of the lanes lost, those not yet written (at `start` or after): taken out of `lanes`, and their
        sockets' event written through write()."""
        for socket, transport in losses:
            at = where.get(transport)
            if at is not None and at >= start and lanes[at] is not None:
                lanes[at] = None
                write(socket, event)
        losses.clear()


# --- The roll call ----------------------------------------------------------------------------------------


class RollCall:
    """The server's sockets of each queue answered for together (consumers.py's docstring): one task per
    queue with sockets here, calling lua/roll_call.lua for ROLL_CALL_SOCKETS of them at a time. A socket's
    lease is taken when it says hello and given back when it closes (store/viewers.py); the roll calls renew
    it, so a server that crashed stops counting its sockets within store.VIEWERS_FRESH_SECONDS."""

    def __init__(self) -> None:
        self.members: dict[str, dict[Socket, None]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.reading = asyncio.Semaphore(READS_AT_ONCE)
        self.leaving: dict[str, list[viewer_services.SocketLease]] = {}  # leases to give back, by queue
        self.giving_back: asyncio.Task[None] | None = None

    def count(self, slug: str) -> int:
        return len(self.members.get(slug, ()))

    def held(self) -> int:
        """The sockets this server holds."""
        return sum(len(members) for members in self.members.values())

    def describe(self) -> str:
        """What this server holds, for its reports (loopwatch.py)."""
        return f"{self.held()} sockets over {len(self.members)} queues"

    def add(self, socket: Socket) -> None:
        self.members.setdefault(socket.slug, {})[socket] = None
        if socket.slug not in self.tasks:
            self.tasks[socket.slug] = asyncio.ensure_future(self._forever(socket.slug))

    def discard(self, socket: Socket) -> None:
        """The socket closed: out of its queue's roll call, and its lease given back (with those of the
        other sockets closing meanwhile, by give_back)."""
        members = self.members.get(socket.slug)
        if members is None or socket not in members:
            return
        del members[socket]
        if not members:
            del self.members[socket.slug]
            task = self.tasks.pop(socket.slug, None)
            if task is not None:
                task.cancel()
        if socket.answering is not None:
            self.leaving.setdefault(socket.slug, []).append(socket.answering.lease)
            if self.giving_back is None or self.giving_back.done():
                self.giving_back = asyncio.ensure_future(self._give_back())

    async def given_back(self) -> None:
        """Until the leases of the sockets closed so far are given back (or their calls failed)."""
        while self.giving_back is not None and not self.giving_back.done():
            await asyncio.shield(self.giving_back)

    async def _give_back(self) -> None:
        """The leases of the sockets that closed, ROLL_CALL_SOCKETS of one queue's per Redis call, until none
        is left: a crowd closing at once (a sale's end, a proxy's restart) is a few calls, not one each, and
        the loop is let go between them. A call that fails leaves its leases to run out on their own."""
        while self.leaving:
            slug, leases = next(iter(self.leaving.items()))
            batch, rest = leases[:ROLL_CALL_SOCKETS], leases[ROLL_CALL_SOCKETS:]
            if rest:
                self.leaving[slug] = rest
            else:
                del self.leaving[slug]
            with contextlib.suppress(redis.RedisError):
                await viewer_services.aviewers_close(slug, batch, now=time.time())
            await asyncio.sleep(0)

    async def call(self, slug: str) -> float:
        """One roll call of the queue's sockets here; returns the seconds until the next."""
        members = [(m, m.answering) for m in self.members.get(slug, ()) if m.answering is not None]
        interval = ROLL_CALL_SECONDS
        for start in range(0, len(members), ROLL_CALL_SOCKETS):
            chunk, sockets = zip(*members[start : start + ROLL_CALL_SOCKETS], strict=True)
            answer = await viewer_services.aroll_call(slug, sockets, now=time.time())
            if answer.outcome == "ok":
                ceiling = selectors.sighting_ceiling(answer.presence_timeout_s, answer.claim_ttl_s)
                interval = min(interval, ceiling)
            else:  # Redis lost the queue's policy: one status read syncs it from the database
                spawn(chunk[0].send_status())
            for index, code in answer.news:
                if chunk[index].heard(code):
                    spawn(self._read(chunk[index]))
        return interval

    async def _read(self, socket: Socket) -> None:
        async with self.reading:  # news for thousands at once (pushes lost) is read a few at a time
            await socket.send_status()

    async def _forever(self, slug: str) -> None:
        interval = ROLL_CALL_SECONDS * random.uniform(0.3, 1.0)  # a server's queues spread out
        while True:
            await asyncio.sleep(interval)
            try:
                interval = await self.call(slug) * random.uniform(0.9, 1.0)
            except redis.RedisError:
                interval = 5.0  # the next will do; the clients' own polls notice meanwhile


_of_loop = PerLoop(lambda: (Router(), RollCall()))


def router() -> Router:
    """The running event loop's router (one per server)."""
    return _of_loop()[0]


def roll_call() -> RollCall:
    """The running event loop's roll call (one per server)."""
    return _of_loop()[1]
