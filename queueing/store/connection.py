"""The Redis client and the scripts: one client per process, every Lua script in one Redis Functions library.

Each atomic transition is one Lua file in `lua/` (the header of each lists its KEYS, ARGV and reply).
`library()` builds one library of them (FUNCTION LOAD): `lua/_lib.lua` once, then each script's body as
a function of its KEYS and ARGV, registered as a Redis function. The library's code runs once, when it is
loaded; before, as EVALSHA scripts, every call re-created the library's functions and decoded the
queue's policy again (a third of a status poll's Redis time, bench/RESULTS.md). The library's name and its
functions' names carry a digest of its code, so processes of two versions (a rolling deploy) each find
their own. A server that does not have it (a fresh or restarted Redis without persistence, FUNCTION
FLUSH) answers "Function not found": the library is loaded and the call retried, here and only here:
`run` for one call, `run_together` for a pipeline, `arun` from the event loop. Redis 7.0 or later.

The visitor hot path's round trips are `Plan`s: the script calls as data and a pure function that reads
their replies. Several calls in one plan run as one call (`combined`: the library's `chain` runs them in
one atomic step, all keys under one hash tag). A plan runs the same from synchronous code (`execute`,
redis-py) and from the web server's event loop (`aexecute`, redis.asyncio): the logic exists once, the
drivers are a few lines.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar

import hiredis
import redis
import redis.asyncio
from django.conf import settings

from .. import conf

T = TypeVar("T")
U = TypeVar("U")

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"


class _Connection:
    """One client per process: after a fork (gunicorn, Celery prefork) the child builds its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._url = ""
        self._client: redis.Redis | None = None

    def get(self) -> redis.Redis:
        url = conf.hot().REDIS_URL
        if self._client is None or self._pid != os.getpid() or self._url != url:
            with self._lock:
                if self._client is None or self._pid != os.getpid() or self._url != url:
                    client = redis.Redis.from_url(
                        url,
                        decode_responses=True,
                        socket_timeout=5,
                        socket_connect_timeout=3,
                        health_check_interval=30,
                    )
                    self._client, self._pid, self._url = client, os.getpid(), url
        assert self._client is not None
        return self._client


_connection = _Connection()


def client() -> redis.Redis:
    return _connection.get()


def raw_client() -> redis.Redis:
    """A separate client that leaves replies as bytes (ticket records are msgpack); close it after use."""
    return redis.Redis.from_url(settings.REDIS_URL)


GATE = "&"  # in a combination's name: each script runs only if the limiter before it allowed the request

# The library's `chain`: several scripts' calls as one (`combined`). ARGV starts with the number of calls,
# 1 when they are gated (every call but the last is a rate limiter, and a refusal ends the run there: the
# reply lists the replies so far; a limiter's reply starts with allowed 0|1), and each call's script name,
# number of keys and number of arguments; then come their arguments. The reply lists theirs.
_CHAIN = """
local function chain(KEYS, ARGV)
  local n, gated = tonumber(ARGV[1]), ARGV[2] == '1'
  local k, a, replies = 1, 3 + 3 * n, {}
  for i = 1, n do
    local name, nk, na = ARGV[3 * i], tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
    replies[i] = SCRIPTS[name]({unpack(KEYS, k, k + nk - 1)}, {unpack(ARGV, a, a + na - 1)})
    k, a = k + nk, a + na
    if gated and i < n and replies[i][1] == 0 then return replies end
  end
  return replies
end
"""


@dataclass(frozen=True)
class Library:
    """The scripts as one Redis Functions library: its name, its code, and its functions' prefix."""

    name: str
    code: str
    prefix: str

    def function(self, script: str) -> str:
        return _function(self.prefix, script)


def _function(prefix: str, script: str) -> str:
    """The function that runs `script` ('status', 'limits/token_bucket'; 'a+b' or 'a&b': `chain`)."""
    if "+" in script or GATE in script:
        return prefix + "chain"
    return prefix + script.replace("/", "__")


@lru_cache(maxsize=1)
def library() -> Library:
    lib = (LUA_DIR / "_lib.lua").read_text()
    scripts = {  # a queue script binds the library's keys first
        path.stem: f"bind(KEYS)\n{path.read_text()}"
        for path in sorted(LUA_DIR.glob("*.lua"))
        if not path.name.startswith("_")
    }
    for folder in ("limits", "window", "beat"):  # the rate limiters, the stateless window, the beat's lease
        scripts.update({f"{folder}/{path.stem}": path.read_text() for path in sorted((LUA_DIR / folder).glob("*.lua"))})
    parts = [lib, "local SCRIPTS = {}"]
    parts += [f"SCRIPTS['{name}'] = function(KEYS, ARGV)\n{body}\nend" for name, body in scripts.items()]
    body = "\n\n".join([*parts, _CHAIN])
    digest = hashlib.sha256(body.encode()).hexdigest()[:12]
    name, prefix = f"waitingroom_{digest}", f"wr{digest}_"
    register = [f"redis.register_function('{_function(prefix, script)}', SCRIPTS['{script}'])" for script in scripts]
    register.append(f"redis.register_function('{_function(prefix, 'a+b')}', chain)")
    return Library(name, "\n".join([f"#!lua name={name}", body, *register, ""]), prefix)


def _not_loaded(exc: redis.exceptions.ResponseError) -> bool:
    return "Function not found" in str(exc)


def _loaded(error: redis.exceptions.ResponseError) -> None:
    """FUNCTION LOAD's error: fine if another process loaded the library meanwhile, else raised."""
    if "already exists" not in str(error):
        if "unknown command" in str(error).lower():
            raise RuntimeError("Waiting Room needs Redis 7.0 or later (Redis Functions)") from error
        raise error


def load_library(client: redis.Redis) -> None:
    """Load the library on the client's server, unless it has it (tools that pipeline FCALLs themselves)."""
    try:
        client.function_load(library().code)
    except redis.exceptions.ResponseError as exc:
        _loaded(exc)


# A library deleted again between loading it and the call (FUNCTION FLUSH, a test) is loaded once more.
LOAD_ATTEMPTS = 3


def _sent(client: redis.Redis, send: Callable[[], T]) -> T:
    """`send()`, and again after loading the library when the server answers that it does not have it."""
    for attempt in range(LOAD_ATTEMPTS):
        try:
            return send()
        except redis.exceptions.ResponseError as exc:
            if not _not_loaded(exc) or attempt == LOAD_ATTEMPTS - 1:
                raise
            load_library(client)
    raise AssertionError("unreachable")


def run(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run one script (its library loaded first when the server does not have it)."""
    client, function = _connection.get(), library().function(name)
    return _sent(client, lambda: client.fcall(function, len(keys), *keys, *args))


ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # (script name, KEYS, ARGV)


def run_together(calls: list[ScriptCall]) -> list[Any]:
    """Several scripts in one round trip (not one atomic step: `combined` makes that). A server without
    the library gets it loaded and the round trip sent again: none of them ran."""
    client, found = _connection.get(), library()

    def send() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.fcall(found.function(name), len(keys), *keys, *args)
        return list(pipe.execute())

    return _sent(client, send)


def combined(calls: Sequence[ScriptCall], *, gated: bool = False) -> ScriptCall:
    """Several script calls as one call of the library's `chain` (its reply lists theirs), named 'a+b'
    ('a&b' when `gated`: the calls before the last are rate limiters, and the rest run while they allow)."""
    if len(calls) == 1:
        return calls[0]
    keys = [key for _, call_keys, _ in calls for key in call_keys]
    header: list[Any] = [len(calls), int(gated)]
    for name, call_keys, call_args in calls:
        header += [name, len(call_keys), len(call_args)]
    args = [*header, *(arg for _, _, call_args in calls for arg in call_args)]
    return (GATE if gated else "+").join(name for name, _, _ in calls), keys, args


@dataclass(frozen=True)
class Plan(Generic[T]):
    """One round trip as data: script calls (run as one script) and how to read their replies. A `gated`
    plan's first calls are rate limiters: a refusal stops it there, and `read` gets fewer replies."""

    calls: tuple[ScriptCall, ...]
    read: Callable[[list[Any]], T]
    gated: bool = False

    def then(self, after: Callable[[T], U]) -> Plan[U]:
        return Plan(self.calls, lambda replies: after(self.read(replies)), self.gated)

    @property
    def call(self) -> ScriptCall:
        """The plan's calls as one."""
        return combined(self.calls, gated=self.gated)


def _replies(calls: Sequence[ScriptCall], reply: Any) -> list[Any]:
    return list(reply) if len(calls) > 1 else [reply]


def execute(plan: Plan[T]) -> T:
    """Run a plan from synchronous code."""
    return plan.read(_replies(plan.calls, run(*plan.call)))


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


class _AsyncConnection:
    """The event loop's client (redis.asyncio, hiredis), one per loop: the web server's hot path. A loop
    belongs to one process (a forked child runs a loop of its own).

    The hot path's scripts (`arun`) go over connections of its own (`_Lane`), not through the client's
    pool: redis-py 8's command path (a lock, a liveness probe of the socket and four metric hooks per
    checkout, a retry wrapper, an event dispatch per release) cost a third of a status poll's Python
    (bench/RESULTS.md). A lane sends one packed FCALL and reads one reply, nothing else."""

    def __init__(self) -> None:
        self._clients: dict[asyncio.AbstractEventLoop, tuple[str, redis.asyncio.Redis, _Lane]] = {}

    def _get(self) -> tuple[redis.asyncio.Redis, _Lane]:
        loop, url = asyncio.get_running_loop(), conf.hot().REDIS_URL
        found = self._clients.get(loop)
        if found is None or found[0] != url:
            client = redis.asyncio.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=5,
                socket_connect_timeout=3,
                # No periodic PING before a command: a connection found dead is retried on a new one
                # (redis-py's default retry), and the hot path does not pay for the check.
                health_check_interval=0,
            )
            pool = client.connection_pool
            pool.connection_class = _hiredis_packing(pool.connection_class)  # type: ignore[arg-type]
            lane = _Lane(pool, timeout=LANE_TIMEOUT_SECONDS, most=LANE_CONNECTIONS)
            found = self._clients[loop] = (url, client, lane)
        return found[1], found[2]

    def get(self) -> redis.asyncio.Redis:
        return self._get()[0]

    def lane(self) -> _Lane:
        return self._get()[1]

    async def close(self) -> None:
        """Close this loop's client and lane (the web server's shutdown)."""
        found = self._clients.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found[2].close()
            await found[1].aclose()


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

    async def command(self, *args: Any) -> Any:
        reused = bool(self._idle)
        try:
            return await self._once(args)
        except (redis.exceptions.ConnectionError, ConnectionError):
            if not reused:
                raise
        return await self._once(args)

    async def _once(self, args: tuple[Any, ...]) -> Any:
        connection = self._idle.pop() if self._idle else await self._take()
        self._busy[connection] = self._loop.time()
        if self._watchdog is None:
            self._watchdog = self._loop.create_task(self._watch())
        try:
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


_async_connection = _AsyncConnection()
aclose = _async_connection.close


async def arun(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """`run` from the event loop."""
    lane, found = _async_connection.lane(), library()
    function = found.function(name)
    for attempt in range(LOAD_ATTEMPTS):
        try:
            return await lane.command("FCALL", function, len(keys), *keys, *args)
        except redis.exceptions.ResponseError as exc:
            if not _not_loaded(exc) or attempt == LOAD_ATTEMPTS - 1:
                raise
            try:
                await lane.command("FUNCTION", "LOAD", found.code)
            except redis.exceptions.ResponseError as error:
                _loaded(error)
    raise AssertionError("unreachable")


async def aexecute(plan: Plan[T]) -> T:
    """Run a plan from the event loop."""
    return plan.read(_replies(plan.calls, await arun(*plan.call)))


async def apublish(messages: Sequence[tuple[str, bytes]]) -> None:
    """PUBLISH each (channel, payload) from the event loop, in one round trip."""
    pipe = _async_connection.get().pipeline(transaction=False)
    for channel, payload in messages:
        pipe.publish(channel, payload)
    await pipe.execute()
