"""uvicorn's sans-I/O websocket protocol (`--ws websockets-sansio`), lighter per connection, for a server that
holds tens of thousands of them (runstack starts uvicorn with `--ws queueing.wsprotocol:LeanSansIOProtocol`):
28.5 → 22.0 KB a socket at 18,000 (bench/RESULTS.md).

Same protocol, same behaviour; three things each connection kept that it does not need (tracemalloc at
3,000 sockets):

- the handshake's request and response, with their headers (~3.4 KB): uvicorn reads neither once the
  handshake is answered, and the app has the request's headers in its scope;
- an asyncio.Queue for the messages the app has not received yet (~2.3 KB: three deques and an Event, each
  deque a block of 64 slots), where a connection holds at most a message or two (uvicorn stops reading the
  client while one waits);
- an asyncio.Event for whether its buffer has room (~0.8 KB, a deque again).

The two stand-ins below do what uvicorn asks of the queue and the event, and nothing more.

And its keepalive pings (`--ws-ping-interval`, `--ws-ping-timeout`: 20 s each) come from one sweep per
server instead of two timers per connection: uvicorn schedules each socket's next ping and its pong
deadline on timers of their own (a TimerHandle each, ~0.5 KB, and at 18,000 sockets 900 pings a second,
each framed by the websockets library and timed by two timers, whose young objects the collector walks
in the middle of fan-outs). The sweep (Keepalive) visits a slice of the server's sockets every
SWEEP_SECONDS, so each is visited once an interval: it writes them one ping frame built once, and fails,
as uvicorn does, a socket whose last ping has gone unanswered for the timeout (1011).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Flag:
    """asyncio.Event as uvicorn's protocol uses it (`writable`): set, clear, is_set and wait, alike."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            self._waiters.remove(waiter)


class Inbox:
    """asyncio.Queue as uvicorn's protocol uses it (`queue`): put_nowait, get and empty; unbounded, first in
    first out, each item to one getter, alike."""

    __slots__ = ("_getters", "_items")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._getters: list[asyncio.Future[None]] = []

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        self._wake_next()

    async def get(self) -> Any:
        while not self._items:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                if getter in self._getters:
                    self._getters.remove(getter)
                elif self._items:
                    self._wake_next()  # woken for an item it will not take: the next getter may
                raise
        return self._items.pop(0)

    def _wake_next(self) -> None:
        while self._getters:
            getter = self._getters.pop(0)
            if not getter.done():
                getter.set_result(None)
                return


SWEEP_SECONDS = 0.25  # the keepalive sweep visits interval / SWEEP_SECONDS slices of the sockets
PACE_SECONDS = 0.004  # the most of a loop turn spent on what the sockets' clients sent (Pacer)


class Pacer:
    """What the clients sent and their connections' ends, handled in the order they came, for at most
    PACE_SECONDS of each turn of the event loop; the rest waits for the next turn, after the loop has
    polled its sockets and run its timers and every task woken meanwhile.

    The event loop hands a protocol everything its sockets received in one poll at once. A crowd closing
    together (a sale's end, a proxy's restart) arrived in one poll, and each close (parsing the frame,
    answering it, waking the socket's task to let go of it) ran before anything else could: 9,000
    sockets closing held the server's loop for 0.56 s while the rest of its sockets waited for their
    events (bench/RESULTS.md). Here a poll only queues what came, a few microseconds a socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: deque[tuple[LeanSansIOProtocol, bytes | None, Exception | None]] = deque()
        self.scheduled = False

    def put(self, protocol: LeanSansIOProtocol, data: bytes | None, lost: Exception | None = None) -> None:
        """Data received (`data`), or the connection lost (data None, and its exception if any)."""
        self.pending.append((protocol, data, lost))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.run)

    def run(self) -> None:
        self.scheduled = False
        pending, until = self.pending, self.loop.time() + PACE_SECONDS
        while pending:
            protocol, data, lost = pending.popleft()
            try:
                if data is None:
                    protocol.lost_now(lost)
                else:
                    protocol.received_now(data)
            except Exception:  # one socket's trouble holds up nobody else's
                logger.exception("a websocket's received data or end failed")
            if self.loop.time() >= until:
                break
        if pending:
            self.scheduled = True
            self.loop.call_soon(self.run)


class PerLoop(Generic[T]):
    """One object per running event loop (and per key it is asked with), made by `make(*key)` on first use;
    those of closed loops are dropped when another is made (tests run many loops in one process)."""

    def __init__(self, make: Callable[..., T]) -> None:
        self.make = make
        self.made: dict[tuple[Any, ...], T] = {}

    def __call__(self, *key: Any) -> T:
        loop = asyncio.get_running_loop()
        found = self.made.get((loop, *key))
        if found is None:
            for old in [old for old in self.made if old[0].is_closed()]:
                del self.made[old]
            found = self.made[(loop, *key)] = self.make(*key)
        return found


_pacer = PerLoop(lambda: Pacer(asyncio.get_running_loop()))


class Keepalive:
    """One event loop's keepalive pings (the module's docstring). A socket is pinged once every interval,
    in the slice it falls in: the sweep takes the sockets held at the start of each interval and visits
    them over the interval's slices. A socket whose ping is unanswered past its timeout is failed."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.sockets: dict[LeanSansIOProtocol, None] = {}
        self.payload = os.urandom(4)  # its pings' payload: a pong that echoes it answers one
        self.frame = bytes((0x89, len(self.payload))) + self.payload  # a ping, unmasked (RFC 6455 5.5.2)
        self.task: asyncio.Task[None] | None = None

    def add(self, protocol: LeanSansIOProtocol) -> None:
        self.sockets[protocol] = None
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._sweep())

    def discard(self, protocol: LeanSansIOProtocol) -> None:
        self.sockets.pop(protocol, None)
        if not self.sockets and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _sweep(self) -> None:
        slices = max(1, round(self.interval / SWEEP_SECONDS))
        loop = asyncio.get_running_loop()
        # The list an interval visited holds the last references to the sockets that closed since: it is let
        # go of a slice at a time over the next interval, so that a crowd closing at once is freed a slice at a
        # time rather than in one turn of the loop (16,500 freed at once held it 76-91 ms, bench/RESULTS.md).
        visited: list[LeanSansIOProtocol] = []
        while True:
            held = list(self.sockets)
            started = loop.time()
            for index in range(slices):
                await asyncio.sleep(max(0.0, started + self.interval * (index + 1) / slices - loop.time()))
                del visited[: -(-len(visited) // (slices - index))]  # its share of what is left
                now = loop.time()
                # A visit may come up to a slice early after one held up by a fan-out: a timeout that
                # just ran out is taken as run out, rather than waited on for a whole interval more.
                self._visit(held[index * len(held) // slices : (index + 1) * len(held) // slices], now, slices)
            visited = held  # (let go of over the next interval, above)

    def _visit(self, protocols: list[LeanSansIOProtocol], now: float, slices: int) -> None:
        # (a frame of its own: the sweep's, which waits between slices, keeps no closed socket in a variable)
        for protocol in protocols:
            if protocol in self.sockets:
                try:
                    protocol.keepalive(now, slack=self.interval / slices)
                except Exception:  # one socket's trouble stops nobody else's pings
                    logger.exception("keepalive of one websocket failed")


_keepalive = PerLoop(Keepalive)  # one sweep per loop and interval


def let_go_within() -> float:
    """Seconds within which this loop's sweeps let go of a socket that closed: the rest of the interval it
    closed in, and the next (0 without a sweep)."""
    loop = asyncio.get_running_loop()
    return 2 * max((sweep.interval for (owner, *_), sweep in _keepalive.made.items() if owner is loop), default=0.0)


class LeanSansIOProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websocket protocol without what a connection keeps and does not need (the module's
    docstring). uvicorn takes it by its import path: `--ws queueing.wsprotocol:LeanSansIOProtocol`.

    `direct` is its transport while a frame may be written to it straight (wsserver.write): answered, its
    buffer not full, no close sent, not lost; else None. Kept as the state changes, so that a fan-out
    over thousands of sockets reads one attribute a socket. uvicorn also closes a transport without a
    close of its own (the client's close answered, a shutdown, the client's end of file, the app's end):
    a writer must still ask the transport whether it is closing, since a frame written after a close
    would follow the close frame out (RFC 6455 5.5.1 forbids it); the two it knows of clear `direct`.

    `watch`, when set (by the app that reads `direct`: consumers.py), is called after each change of it, so
    that a fan-out can keep the transports it writes to by group and not look at each socket (wsserver.Router);
    the app clears it when it is done with the socket."""

    direct: Any = None
    watch: Callable[[], None] | None = None
    _answered = False
    _close_sent = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag(True)  # type: ignore[assignment]
        self.pinged_at: float | None = None  # when its unanswered ping was written
        self.sweep: Keepalive | None = None
        # Its loop's Pacer, found once: asyncio.get_running_loop() asks the OS for the process id each time, a
        # system call per frame received that a crowd's close paid 16,500 times in one turn of the loop.
        self.pacer = _pacer()

    @property
    def close_sent(self) -> bool:
        return self._close_sent

    @close_sent.setter
    def close_sent(self, value: bool) -> None:  # uvicorn sets it wherever it sends or fails a close
        self._close_sent = value
        if value:
            self._direct(None)

    def _direct(self, transport: Any) -> None:
        if transport is not self.direct:
            self.direct = transport
            if self.watch is not None:
                self.watch()

    def _writable_directly(self) -> None:
        ready = self._answered and not self._close_sent and not self.disconnected and self.writable.is_set()
        self._direct(self.transport if ready else None)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._direct(None)

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.transport.is_closing():
            self._writable_directly()

    # What the client sent, and the connection's end, are handled in turns (Pacer); the transport's own
    # state (is_closing) is current meanwhile, which is all a writer reads.
    def data_received(self, data: bytes) -> None:
        self.pacer.put(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._direct(None)
        self.pacer.put(self, None, exc)

    def received_now(self, data: bytes) -> None:
        super().data_received(data)

    def lost_now(self, exc: Exception | None) -> None:
        self._direct(None)
        super().connection_lost(exc)

    # These two clear `direct` once uvicorn has closed the transport, so that the watcher sees a transport
    # closing (a fan-out skips those) rather than a socket gone slow, which it must look at again.
    def handle_close(self, event: Any) -> None:
        try:
            super().handle_close(event)
        finally:
            self._direct(None)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._direct(None)

    def start_keepalive(self) -> None:
        # uvicorn calls this once it has written the handshake's answer (101), the last use of the request
        # and of the response it built for it.
        self.request = self.response = None  # type: ignore[assignment]
        self._answered = True
        self._writable_directly()
        if self.ping_interval is not None and self.ping_interval > 0:
            self.sweep = _keepalive(self.ping_interval)
            self.sweep.add(self)

    def stop_keepalive(self) -> None:
        if self.sweep is not None:
            self.sweep.discard(self)
            self.sweep = None
        super().stop_keepalive()

    def keepalive(self, now: float, *, slack: float = 0.0) -> None:
        """Its turn in the sweep: a ping, or the end if the last one went unanswered for the timeout (less
        `slack`, at most a quarter of it)."""
        if self.close_sent or self.transport.is_closing() or self.sweep is None:
            return
        if self.pinged_at is not None and self.ping_timeout is not None:
            if now - self.pinged_at >= self.ping_timeout - min(slack, self.ping_timeout / 4):
                self.pinged_at = None
                with contextlib.suppress(Exception):  # its connection is going anyway
                    self.keepalive_timeout()  # uvicorn's: a close frame (1011), and the transport closed
            return  # else its pong may still come
        self.pinged_at = now
        self.transport.write(self.sweep.frame)

    def handle_pong(self, event: Any) -> None:
        if self.sweep is not None and bytes(event.data) == self.sweep.payload:
            self.pinged_at = None
