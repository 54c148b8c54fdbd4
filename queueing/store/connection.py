"""The Redis client and the script loader: one client per process, every Lua script registered once.

Each atomic transition is one Lua file in `lua/` (the header of each lists its KEYS, ARGV and reply);
`lua/_lib.lua` is prepended to every queue script, with only the functions it uses. Scripts run by
EVALSHA; a server that does not know a script (NOSCRIPT after a restart or SCRIPT FLUSH) gets it loaded
and the call retried once, here and only here: `run` for one script (redis-py's `Script` does it),
`run_together` for a pipeline of several.

The visitor hot path's round trips are `Plan`s: the script calls as data and a pure function that reads
their replies. Several calls in one plan run as one script (`combined`: one EVALSHA, one atomic step, all
keys under one hash tag). A plan runs the same from synchronous code (`execute`, redis-py) and from the
web server's event loop (`aexecute`, redis.asyncio): the logic exists once, the drivers are a few lines.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar

import hiredis
import redis
import redis.asyncio
from django.conf import settings
from redis.commands.core import Script

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
        self._scripts: dict[str, Script] = {}

    def get(self) -> tuple[redis.Redis, dict[str, Script]]:
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
                    sources = {**_sources(), **_plain_sources()}
                    self._scripts = {name: client.register_script(src) for name, src in sources.items()}
                    self._client, self._pid, self._url = client, os.getpid(), url
        assert self._client is not None
        return self._client, self._scripts

    def script(self, name: str) -> Script:
        client, scripts = self.get()
        found = scripts.get(name)
        if found is None:  # a combination of scripts (see `combined`), registered when first asked for
            with self._lock:
                gated = GATE in name
                names = tuple(name.split(GATE if gated else "+"))
                found = scripts.get(name) or client.register_script(_combined_source(names, gated=gated))
                scripts[name] = found
        return found


_connection = _Connection()


def client() -> redis.Redis:
    return _connection.get()[0]


def raw_client() -> redis.Redis:
    """A separate client that leaves replies as bytes (ticket records are msgpack); close it after use."""
    return redis.Redis.from_url(settings.REDIS_URL)


_FUNCTION = re.compile(r"^local function ([A-Za-z_][A-Za-z0-9_]*)\(", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _with_library(lib: str, body: str) -> str:
    """The script with the library functions it uses (transitively) in front of it.

    Every EVALSHA runs the whole chunk, and each function definition in it creates a closure: the full
    library costs about 20 µs of Redis time per call, most of a status poll's budget. So each script
    carries only what it calls. Everything before the first function (keys, constants) always goes in.
    """
    starts = [m.start() for m in _FUNCTION.finditer(lib)]
    preamble, blocks = lib[: starts[0]], {}
    for begin, end in zip(starts, [*starts[1:], len(lib)], strict=True):
        block = lib[begin:end]
        # A comment block just above a function belongs to the next function, not this one.
        cut = block.rstrip().rfind("\nend")
        code = block[: cut + 4] if cut >= 0 else block
        blocks[_FUNCTION.match(block).group(1)] = code  # type: ignore[union-attr]
    needed: set[str] = set()
    pending = set(_NAME.findall(body)) & set(blocks)
    while pending:
        name = pending.pop()
        needed.add(name)
        pending |= (set(_NAME.findall(blocks[name])) & set(blocks)) - needed
    used = [code for name, code in blocks.items() if name in needed]
    return preamble + "\n\n".join(used) + "\n\n" + body


@lru_cache(maxsize=1)
def _sources() -> dict[str, str]:
    lib = (LUA_DIR / "_lib.lua").read_text()
    return {
        path.stem: _with_library(lib, path.read_text())
        for path in sorted(LUA_DIR.glob("*.lua"))
        if not path.name.startswith("_")
    }


@lru_cache(maxsize=1)
def _plain_sources() -> dict[str, str]:
    """The rate limiters (lua/limits/), the stateless window (lua/window/) and the beat's lease (lua/beat/):
    no queue library."""
    return {
        f"{folder}/{path.stem}": path.read_text()
        for folder in ("limits", "window", "beat")
        for path in sorted((LUA_DIR / folder).glob("*.lua"))
    }


GATE = "&"  # in a combination's name: each script runs only if the limiter before it allowed the request


def _combined_source(names: tuple[str, ...], *, gated: bool = False) -> str:
    """Several scripts as one: each runs as a function of its own KEYS and ARGV, in order, and the reply
    is the list of their replies. ARGV starts with each script's number of keys and of arguments.
    `gated`: every script but the last is a rate limiter, and a refusal ends the run there (the reply
    lists the replies so far; a limiter's reply starts with allowed 0|1)."""
    stop = "  if replies[i][1] == 0 then return replies end\n" if gated else ""
    sources = {**_sources(), **_plain_sources()}
    parts = [f"local function script_{i}(KEYS, ARGV)\n{sources[name]}\nend\n" for i, name in enumerate(names)]
    return (
        f"-- combined: {' + '.join(names)}\n"
        + "".join(parts)
        + f"""local scripts, replies = {{{", ".join(f"script_{i}" for i in range(len(names)))}}}, {{}}
local k, a = 1, {2 * len(names)} + 1
for i, run in ipairs(scripts) do
  local nk, na = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  replies[i] = run({{unpack(KEYS, k, k + nk - 1)}}, {{unpack(ARGV, a, a + na - 1)}})
  k, a = k + nk, a + na
{stop}end
return replies
"""
    )


def script(name: str) -> Script:
    """The registered script object (tests use it to exercise NOSCRIPT recovery); 'a+b' is `combined`."""
    return _connection.script(name)


def run(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run one script by EVALSHA (loaded again and retried once on NOSCRIPT, by redis-py's Script)."""
    return script(name)(keys=list(keys), args=list(args))


ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # (script name, KEYS, ARGV)


def run_together(calls: list[ScriptCall], then: Callable[[Any], None] | None = None) -> list[Any]:
    """Several scripts (and, with `then`, plain commands added to the pipeline after them) in one round
    trip (a plain pipeline of EVALSHA: redis-py's script pipelines would add a SCRIPT EXISTS round trip
    each time). A server that lost its scripts gets them loaded, once."""
    client, scripts = _connection.get()
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(scripts[name].sha, len(keys), *keys, *args)
        if then is not None:
            then(pipe)
        try:
            return list(pipe.execute())
        except redis.exceptions.NoScriptError:
            if attempt == 2:
                raise
            for name, _, _ in calls:
                scripts[name].sha = client.script_load(scripts[name].script)
    raise AssertionError("unreachable")


def combined(calls: Sequence[ScriptCall], *, gated: bool = False) -> ScriptCall:
    """Several script calls as one call of their combination (one EVALSHA; its reply lists theirs).
    `gated`: the calls before the last are rate limiters, and the rest run only while they allow."""
    if len(calls) == 1:
        return calls[0]
    keys = [key for _, call_keys, _ in calls for key in call_keys]
    counts = [count for _, call_keys, call_args in calls for count in (len(call_keys), len(call_args))]
    args = [*counts, *(arg for _, _, call_args in calls for arg in call_args)]
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
        if isinstance(args[0], str) and " " in args[0]:  # 'SCRIPT LOAD': the words go as arguments
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]


@lru_cache(maxsize=8)
def _hiredis_packing(connection_class: type) -> type:
    """The client's connection class (plain, TLS or unix socket, as its URL says), packing with hiredis."""
    return type(f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})


# The longest the event loop's scripts wait for Redis's reply before the request is answered 503.
LANE_TIMEOUT_SECONDS = 5.0


class _AsyncConnection:
    """The event loop's client (redis.asyncio, hiredis), one per loop: the web server's hot path. A loop
    belongs to one process (a forked child runs a loop of its own).

    The hot path's scripts (`arun`) go over connections of its own (`_Lane`), not through the client's
    pool: redis-py 8's command path (a lock, a liveness probe of the socket and four metric hooks per
    checkout, a retry wrapper, an event dispatch per release) cost a third of a status poll's Python
    (bench/RESULTS.md). A lane sends one packed EVALSHA and reads one reply, nothing else."""

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
            found = self._clients[loop] = (url, client, _Lane(pool, timeout=LANE_TIMEOUT_SECONDS))
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
    task or a timer per command: a tenth of a poll's Python)."""

    def __init__(self, pool: redis.asyncio.ConnectionPool, *, timeout: float = 5.0) -> None:
        self._pool = pool
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._idle: list[redis.asyncio.connection.AbstractConnection] = []
        self._busy: dict[redis.asyncio.connection.AbstractConnection, float] = {}
        self._expired: set[redis.asyncio.connection.AbstractConnection] = set()
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
        connection = self._idle.pop() if self._idle else await self._connected()
        self._busy[connection] = self._loop.time()
        if self._watchdog is None:
            self._watchdog = self._loop.create_task(self._watch())
        try:
            await connection.send_packed_command(connection.pack_command(*args), check_health=False)
            reply = await connection.read_response()
        except redis.exceptions.ResponseError:
            self._idle.append(connection)  # an error reply (NOSCRIPT, a script's error): the connection is fine
            raise
        except BaseException as exc:
            await connection.disconnect(nowait=True)
            if connection in self._expired:
                self._expired.discard(connection)
                raise redis.exceptions.TimeoutError(f"No reply from Redis in {self._timeout} s") from exc
            raise
        finally:
            self._busy.pop(connection, None)
        self._idle.append(connection)
        return reply

    async def _connected(self) -> redis.asyncio.connection.AbstractConnection:
        connection: redis.asyncio.connection.AbstractConnection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        await connection.connect()  # type: ignore[no-untyped-call]
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
        for connection in idle:
            await connection.disconnect()


_async_connection = _AsyncConnection()
aclose = _async_connection.close


async def arun(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """`run` from the event loop: EVALSHA, and on NOSCRIPT the script loaded and the call retried once."""
    lane, found = _async_connection.lane(), script(name)
    try:
        return await lane.command("EVALSHA", found.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        found.sha = await lane.command("SCRIPT", "LOAD", found.script)
        return await lane.command("EVALSHA", found.sha, len(keys), *keys, *args)


async def aexecute(plan: Plan[T]) -> T:
    """Run a plan from the event loop."""
    return plan.read(_replies(plan.calls, await arun(*plan.call)))


async def apublish(messages: Sequence[tuple[str, bytes]]) -> None:
    """PUBLISH each (channel, payload) from the event loop, in one round trip."""
    pipe = _async_connection.get().pipeline(transaction=False)
    for channel, payload in messages:
        pipe.publish(channel, payload)
    await pipe.execute()
