"""The event loop's connections to Redis: the web and websocket servers' hot path (`connection.arun`).

A lane (`_Lane`) sends one packed FCALL and reads one reply over connections of its own, made as the
client's pool makes them, with a watchdog instead of a deadline per command; a Redis Cluster has a lane per
node (`_ClusterLanes`), which follows MOVED, ASK and TRYAGAIN and reads the slot map again when told to.
`AsyncConnection` holds each event loop's route. The synchronous client and the scripts' library are
`connection`'s.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import hiredis
import redis
import redis.asyncio
from redis.crc import key_slot

from .. import conf


def cluster_nodes(nodes: str) -> list[tuple[str, int]]:
    """REDIS_CLUSTER_NODES ('host:port,host:port'): the nodes a cluster client starts from."""
    found = []
    for part in nodes.split(","):
        host, _, port = part.strip().rpartition(":")
        if part.strip():
            found.append((host or "127.0.0.1", int(port)))
    return found


class _HiredisPacking:
    """redis.asyncio packs commands in Python (the synchronous client uses hiredis): a status poll's thirty
    arguments cost more to pack than the rest of the poll's Python. Packed by hiredis, byte for byte the same."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:  # 'FUNCTION LOAD': the words go as arguments
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]


@lru_cache(maxsize=8)
def _hiredis_packing(connection_class: type) -> type:
    """The client's connection class (plain, TLS or unix socket, as its URL says), packing with hiredis."""
    return type(f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})


# The longest the event loop's scripts wait for Redis's reply before the request is answered 503.
LANE_TIMEOUT_SECONDS = 5.0
LANE_CONNECTIONS = 32  # per event loop (_Lane): Redis runs one command at a time; more only queue there


def _async_pool(**where: Any) -> redis.asyncio.ConnectionPool:
    """A pool for a lane to make its connections with (hiredis packing; its url=, or host= and port=)."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": 5,
        "socket_connect_timeout": 3,
        # No periodic PING before a command: a connection found dead is retried on a new one, and the
        # hot path does not pay for the check.
        "health_check_interval": 0,
    }
    if "url" in where:
        pool = redis.asyncio.ConnectionPool.from_url(where["url"], **options)
    else:
        pool = redis.asyncio.ConnectionPool(**where, **options)
    pool.connection_class = _hiredis_packing(pool.connection_class)  # type: ignore[arg-type]
    return pool


class AsyncConnection:
    """The event loop's way to the live state, one per loop: the web server's hot path. A loop belongs to
    one process (a forked child runs a loop of its own).

    The hot path's scripts (`arun`) go over connections of their own (`_Lane`), not through a redis-py
    client's pool: redis-py 8's command path (a lock, a liveness probe of the socket and four metric hooks
    per checkout, a retry wrapper, an event dispatch per release) cost a third of a status poll's Python
    (bench/RESULTS.md). A lane sends one packed FCALL and reads one reply, nothing else. On a Redis
    Cluster, a lane per node (`_ClusterLanes`)."""

    def __init__(self) -> None:
        self._routes: dict[asyncio.AbstractEventLoop, tuple[tuple[str, str], _Lane | _ClusterLanes]] = {}

    def route(self) -> _Lane | _ClusterLanes:
        loop, hot = asyncio.get_running_loop(), conf.hot()
        where = (hot.REDIS_URL, hot.REDIS_CLUSTER_NODES)
        found = self._routes.get(loop)
        if found is None or found[0] != where:
            for old in [key for key in self._routes if key.is_closed()]:
                del self._routes[old]
            if where[1]:
                route: _Lane | _ClusterLanes = _ClusterLanes(cluster_nodes(where[1]))
            else:
                route = _Lane(_async_pool(url=where[0]), timeout=LANE_TIMEOUT_SECONDS, most=LANE_CONNECTIONS)
            found = self._routes[loop] = (where, route)
        return found[1]

    def lane(self) -> _Lane:
        """The single Redis's lane (tests)."""
        route = self.route()
        assert isinstance(route, _Lane)
        return route

    async def close(self) -> None:
        """Close this loop's lanes (the web server's shutdown)."""
        found = self._routes.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found[1].close()


class _Lane:
    """Connections for one command and its reply at a time, each made as the client's pool makes them
    (same address, credentials, database, TLS and hiredis packing) and kept while they work.

    A connection that fails is dropped, never reused. A command on a kept connection that finds it closed
    (Redis restarted, an idle timeout) is sent once more on a new one: it cannot have run. A command that
    gets no reply within `timeout` seconds fails with redis's TimeoutError: a watchdog, once a second,
    closes connections that have waited that long (a deadline per command, as redis-py keeps it, costs a
    task or a timer per command: a tenth of a poll's Python).

    At most `most` connections are open at a time: a command beyond them waits for one to come free, and
    fails with TimeoutError if none does within `timeout`. A burst (a websocket server's sockets all saying
    hello again after a restart) would otherwise open a connection per command in flight and keep every
    one of them: 117 after 1,000 hellos, towards Redis's limit of clients, on every server at once."""

    def __init__(
        self, pool: redis.asyncio.ConnectionPool, *, timeout: float = 5.0, most: int = LANE_CONNECTIONS
    ) -> None:
        self._pool = pool
        self._timeout = timeout
        self._most = most
        self._open = 0  # connections open or being opened, and places handed to a waiter to open one
        self._loop = asyncio.get_running_loop()
        self._idle: list[redis.asyncio.connection.AbstractConnection] = []
        self._busy: dict[redis.asyncio.connection.AbstractConnection, float] = {}
        self._expired: set[redis.asyncio.connection.AbstractConnection] = set()
        self._waiters: deque[asyncio.Future[redis.asyncio.connection.AbstractConnection | None]] = deque()
        self._watchdog: asyncio.Task[None] | None = None

    async def command(self, *args: Any, asking: bool = False) -> Any:
        """Send one command and read its reply; `asking`: after ASKING, on the same connection (a slot
        being moved to this node, which answers for it only so)."""
        reused = bool(self._idle)
        try:
            return await self._once(args, asking)
        except (redis.exceptions.ConnectionError, ConnectionError):
            if not reused:
                raise
        return await self._once(args, asking)

    async def call(self, keys: Sequence[str], *args: Any) -> Any:
        return await self.command(*args)

    async def _once(self, args: tuple[Any, ...], asking: bool = False) -> Any:
        connection = self._idle.pop() if self._idle else await self._take()
        self._busy[connection] = self._loop.time()
        if self._watchdog is None:
            self._watchdog = self._loop.create_task(self._watch())
        try:
            if asking:
                packed = connection.pack_commands([("ASKING",), args])
                await connection.send_packed_command(packed, check_health=False)
                await connection.read_response()
            else:
                await connection.send_packed_command(connection.pack_command(*args), check_health=False)
            reply = await connection.read_response()
        except redis.exceptions.ResponseError:
            self._give(connection)  # an error reply (no library, a script's error): the connection is fine
            raise
        except BaseException as exc:
            try:
                await connection.disconnect(nowait=True)
            finally:
                self._give(None)
            if connection in self._expired:
                self._expired.discard(connection)
                raise redis.exceptions.TimeoutError(f"No reply from Redis in {self._timeout} s") from exc
            raise
        finally:
            self._busy.pop(connection, None)
        self._give(connection)
        return reply

    async def _take(self) -> redis.asyncio.connection.AbstractConnection:
        """None idle: a new one while fewer than `most` are open, else the next to come free."""
        if self._open >= self._most:
            waiter: asyncio.Future[redis.asyncio.connection.AbstractConnection | None] = self._loop.create_future()
            self._waiters.append(waiter)
            timer = self._loop.call_later(self._timeout, self._expire, waiter)
            try:
                handed = await waiter
            except BaseException:  # cancelled (or a timeout)
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._give(waiter.result())  # handed one, and gone: the next may have it
                raise
            finally:
                timer.cancel()
            if handed is not None:
                return handed
        else:
            self._open += 1
        try:  # a place of its own (or a dropped connection's, handed on): it opens a connection there
            return await self._connected()
        except BaseException:
            self._give(None)
            raise

    def _expire(self, waiter: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_exception(redis.exceptions.TimeoutError(f"No Redis connection free in {self._timeout} s"))

    def _give(self, connection: redis.asyncio.connection.AbstractConnection | None) -> None:
        """A connection back, or (None) the place of one dropped: to the first waiter still waiting, else
        kept idle (a place: freed)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        if connection is None:
            self._open -= 1
        else:
            self._idle.append(connection)

    async def _connected(self) -> redis.asyncio.connection.AbstractConnection:
        connection: redis.asyncio.connection.AbstractConnection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.connect()  # type: ignore[no-untyped-call]
        except BaseException:  # cancelled mid-handshake too: not left half open
            await connection.disconnect(nowait=True)
            raise
        connection.socket_timeout = None  # the watchdog's deadline instead (connecting keeps its own)
        return connection

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self._timeout / 2))
            late = self._loop.time() - self._timeout
            for connection, since in list(self._busy.items()):
                if since < late and self._busy.pop(connection, None) is not None:
                    self._expired.add(connection)
                    await connection.disconnect(nowait=True)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        for connection in idle:
            await connection.disconnect()


# A command redirected (MOVED, ASK) or told to try again (TRYAGAIN: a multi-key call, as every script is,
# while its slot's keys are part moved) is sent again, up to this many times in all, TRYAGAIN after a
# pause: about 2 s for a slot's move to finish before the call fails (the API's 503).
CLUSTER_ATTEMPTS = 16
TRY_AGAIN_SECONDS = 0.25  # (ASK, then TRYAGAIN: 8 pauses)
REFRESH_SECONDS = 0.5  # the slot map is read again at most this often


class _ClusterLanes:
    """The event loop's scripts on a Redis Cluster: a lane per node, each call sent to the master serving
    its keys' slot (a queue's keys are under one hash tag: one slot; `run`'s callers never mix queues).

    The slot map comes from CLUSTER SLOTS, asked of any node that answers (those of the last map first,
    then REDIS_CLUSTER_NODES). A node that answers MOVED (a slot moved for good, a replica promoted) has
    the slot taken as its, and the map is read again; ASK (a slot being moved) sends that call alone to the
    node it names, after ASKING; TRYAGAIN (a multi-key call while its slot moves) waits a moment and sends
    it again. A node that cannot be reached (a master down before its replica takes over) fails the call
    (the API's 503) and has the map read again, so that calls after the failover go to the new master."""

    def __init__(self, startup: list[tuple[str, int]]) -> None:
        self._startup = startup
        self._slots: list[tuple[str, int] | None] = [None] * 16384
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._known: list[tuple[str, int]] = list(startup)
        self._refreshed_at = -REFRESH_SECONDS
        self._refreshing: asyncio.Future[None] | None = None

    def _lane(self, node: tuple[str, int]) -> _Lane:
        found = self._lanes.get(node)
        if found is None:
            pool = _async_pool(host=node[0], port=node[1])
            found = self._lanes[node] = _Lane(pool, timeout=LANE_TIMEOUT_SECONDS, most=LANE_CONNECTIONS)
        return found

    async def call(self, keys: Sequence[str], *args: Any) -> Any:
        slot = key_slot(keys[0].encode()) if keys else 0
        asking: tuple[str, int] | None = None
        for _ in range(CLUSTER_ATTEMPTS):
            node = asking or self._slots[slot] or await self._master(slot)
            try:
                return await self._lane(node).command(*args, asking=asking is not None)
            except redis.exceptions.MovedError as exc:
                self._slots[slot], asking = (str(exc.host), int(exc.port)), None
                self._stale()
            except redis.exceptions.AskError as exc:
                asking = (str(exc.host), int(exc.port))
            except redis.exceptions.TryAgainError:  # its keys part here, part there: the move ends soon
                asking = None
                await asyncio.sleep(TRY_AGAIN_SECONDS)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError):
                self._stale()
                raise
        raise redis.exceptions.ClusterError(f"slot {slot}: still redirected after {CLUSTER_ATTEMPTS} attempts")

    async def _master(self, slot: int) -> tuple[str, int]:
        await self._refresh()
        node = self._slots[slot]
        if node is None:
            raise redis.exceptions.ClusterDownError(f"no node serves slot {slot}")
        return node

    def _stale(self) -> None:
        """Read the slot map again soon (not now: the call that found it stale fails or moves on)."""
        if self._refreshing is None and asyncio.get_running_loop().time() - self._refreshed_at >= REFRESH_SECONDS:
            self._refreshing = asyncio.ensure_future(self._read_map())

    async def _refresh(self) -> None:
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._read_map())
        await asyncio.shield(self._refreshing)

    async def _read_map(self) -> None:
        try:
            error: Exception | None = None
            for node in dict.fromkeys([*self._known, *self._startup]):
                try:
                    reply = await self._lane(node).command("CLUSTER", "SLOTS")
                except (redis.exceptions.RedisError, ConnectionError) as exc:
                    error = exc
                    continue
                slots: list[tuple[str, int] | None] = [None] * 16384
                known: list[tuple[str, int]] = []
                for start, end, master, *replicas in reply:
                    address = (str(master[0]) or node[0], int(master[1]))
                    slots[int(start) : int(end) + 1] = [address] * (int(end) - int(start) + 1)
                    known += [address, *((str(r[0]) or node[0], int(r[1])) for r in replicas)]
                self._slots, self._known = slots, known
                return
            raise redis.exceptions.ConnectionError(f"no node of the Redis Cluster answered: {error}")
        finally:
            self._refreshed_at = asyncio.get_running_loop().time()
            self._refreshing = None

    async def close(self) -> None:
        for lane in self._lanes.values():
            await lane.close()
