"""uvicorn's sans-I/O websocket protocol (`--ws websockets-sansio`), lighter by a quarter per connection, for
a server that holds tens of thousands of them (runstack starts uvicorn with `--ws
queueing.wsprotocol:LeanSansIOProtocol`).

Same protocol, same behaviour; three things each connection kept that it does not need (tracemalloc at
3,000 sockets, bench/RESULTS.md):

- the handshake's request and response, with their headers (~3.4 KB): uvicorn reads neither once the
  handshake is answered, and the app has the request's headers in its scope;
- an asyncio.Queue for the messages the app has not received yet (~2.3 KB: three deques and an Event, each
  deque a block of 64 slots), where a connection holds at most a message or two (uvicorn stops reading the
  client while one waits);
- an asyncio.Event for whether its buffer has room (~0.8 KB, a deque again).

The two stand-ins below do what uvicorn asks of the queue and the event, and nothing more.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


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


class LeanSansIOProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websocket protocol without what a connection keeps and does not need (the module's
    docstring). uvicorn takes it by its import path: `--ws queueing.wsprotocol:LeanSansIOProtocol`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag(True)  # type: ignore[assignment]

    def start_keepalive(self) -> None:
        # uvicorn calls this once it has written the handshake's answer (101), the last use of the request
        # and of the response it built for it.
        self.request = self.response = None  # type: ignore[assignment]
        super().start_keepalive()
