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
import contextlib
import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import hiredis
import redis
import redis.asyncio
from django.conf import settings
from redis._parsers import CommandsParser
from redis.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from .. import conf, instruments

T = TypeVar("T")
U = TypeVar("U")

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"


def cluster_nodes(nodes: str) -> list[tuple[str, int]]:
    """REDIS_CLUSTER_NODES ('host:port,host:port'): the nodes a cluster client starts from."""
    found = []
    for part in nodes.split(","):
        host, _, port = part.strip().rpartition(":")
        if part.strip():
            found.append((host or "127.0.0.1", int(port)))
    return found


class _FcallKeys(CommandsParser):
    """FCALL's keys read from its own numkeys, as redis-py reads EVAL's, instead of asking the server
    (COMMAND GETKEYS, which redis-py sends for a command with movable keys: a round trip more per call)."""

    def __init__(self, parsed: CommandsParser) -> None:  # not super().__init__: it would ask COMMAND again
        self.commands, self.redis_connection = parsed.commands, parsed.redis_connection

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        if args and str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            return list(args[3 : 3 + int(args[2])]) or None
        return super().get_keys(redis_conn, *args)  # type: ignore[no-untyped-call]


class _Cluster(redis.RedisCluster):
    """redis-py's cluster client whose own failures are Redis errors, as every other store failure is (the
    API answers them 503): RedisClusterException (no node reachable, a slot that no node serves during a
    failover) is not a RedisError."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            raise redis.exceptions.ClusterError(str(exc)) from exc

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        execute = pipe.execute

        def guarded(raise_on_error: bool = True) -> list[Any]:
            try:
                return list(execute(raise_on_error))
            except RedisClusterException as exc:
                raise redis.exceptions.ClusterError(str(exc)) from exc

        pipe.execute = guarded
        return pipe


def cluster_client(nodes: str, *, decode_responses: bool = True) -> redis.RedisCluster:
    """A client of the Redis Cluster at `nodes` (REDIS_CLUSTER_NODES). It routes each command to the
    master of its keys' slot and follows MOVED and ASK; FUNCTION LOAD goes to every master."""
    try:
        client = _Cluster(
            startup_nodes=[ClusterNode(host, port) for host, port in cluster_nodes(nodes)],  # type: ignore[no-untyped-call]
            decode_responses=decode_responses,
            socket_timeout=5,
            socket_connect_timeout=3,
        )
    except RedisClusterException as exc:  # no node answered
        raise redis.exceptions.ConnectionError(f"Redis Cluster at {nodes}: {exc}") from exc
    client.commands_parser = _FcallKeys(client.commands_parser)
    return client


Client = redis.Redis | redis.RedisCluster


class _Connection:
    """One client per process: after a fork (gunicorn, Celery prefork) the child builds its own. A Redis
    Cluster's when REDIS_CLUSTER_NODES names one, else the single Redis at REDIS_URL."""

    def __init__(self, *, decode_responses: bool = True) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._where: tuple[str, str] = ("", "")
        self._client: Any = None
        self._decode = decode_responses

    def get(self) -> Any:
        hot = conf.hot()
        where = (hot.REDIS_URL, hot.REDIS_CLUSTER_NODES)
        if self._client is None or self._pid != os.getpid() or self._where != where:
            with self._lock:
                if self._client is None or self._pid != os.getpid() or self._where != where:
                    if where[1]:
                        client: Any = cluster_client(where[1], decode_responses=self._decode)
                    else:
                        client = redis.Redis.from_url(
                            where[0],
                            decode_responses=self._decode,
                            socket_timeout=5,
                            socket_connect_timeout=3,
                            health_check_interval=30,
                        )
                    self._client, self._pid, self._where = client, os.getpid(), where
        return self._client


_connection = _Connection()
_raw_connection = _Connection(decode_responses=False)


def client() -> redis.Redis:
    """The live state's client: a redis.Redis, or a redis.RedisCluster, which speaks the same commands
    (typed as the former: every call here names its keys, all of one queue under one hash tag)."""
    return cast(redis.Redis, _connection.get())


def clustered() -> bool:
    """Whether the live state is on a Redis Cluster (REDIS_CLUSTER_NODES)."""
    return bool(conf.hot().REDIS_CLUSTER_NODES)


def raw_client() -> redis.Redis:
    """The live state's client that leaves replies as bytes (ticket records are msgpack), one per process."""
    return cast(redis.Redis, _raw_connection.get())


class _LayerConnection:
    """The channel layer's Redis (CHANNEL_LAYER_URL; REDIS_URL's by default), where events are published
    (realtime.py): one client per process, and one per event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: tuple[int, str, redis.Redis] | None = None
        self._async: dict[asyncio.AbstractEventLoop, tuple[str, redis.asyncio.Redis]] = {}

    def get(self) -> redis.Redis:
        url, found = layer_url(), self._sync
        if found is None or found[0] != os.getpid() or found[1] != url:
            with self._lock:
                client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3, health_check_interval=30)
                found = self._sync = (os.getpid(), url, client)
        return found[2]

    def aget(self) -> redis.asyncio.Redis:
        loop, url = asyncio.get_running_loop(), layer_url()
        found = self._async.get(loop)
        if found is None or found[0] != url:
            for old in [key for key in self._async if key.is_closed()]:
                del self._async[old]
            client = redis.asyncio.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3)
            found = self._async[loop] = (url, client)
        return found[1]


_layer = _LayerConnection()


def layer_url() -> str:
    return str(settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0])


def publish(messages: Sequence[tuple[str, bytes]]) -> None:
    """PUBLISH each (channel, payload) on the channel layer's Redis, in one round trip."""
    pipe = _layer.get().pipeline(transaction=False)
    for channel, payload in messages:
        pipe.publish(channel, payload)
    pipe.execute()


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
        if isinstance(client, redis.RedisCluster):  # every master; REPLACE: some may have it already
            client.function_load(library().code, replace=True)
        else:
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
    with _timed(name):
        return _sent(client, lambda: client.fcall(function, len(keys), *keys, *args))


@contextlib.contextmanager
def _timed(script: str) -> Iterator[None]:
    """Times a script call (README "Metrics"), and counts it by its error's class when it fails."""
    started = time.perf_counter()
    try:
        yield
    except redis.RedisError as exc:
        instruments.script_failed(script, exc)
        raise
    instruments.script_timer(script).observe(time.perf_counter() - started)


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

    with _timed("+".join(name for name, _, _ in calls) if len(calls) < 4 else "together"):
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


def _apart(calls: Sequence[ScriptCall]) -> bool:
    """Whether a plan's calls must run one by one: on a cluster, when their keys are in different slots
    (a join's limiter keyed by the client's address, and the queue's script), which no one script may
    touch. Each call is atomic still; the limiter's verdict comes first, as in one script."""
    if len(calls) < 2 or not conf.hot().REDIS_CLUSTER_NODES:
        return False
    return len({key_slot(keys[0].encode()) for _, keys, _ in calls if keys}) > 1


def _refused(plan: Plan[Any], index: int, reply: Any) -> bool:
    """A gated plan's limiter (every call but the last) said no: its reply starts with allowed 0."""
    return plan.gated and index < len(plan.calls) - 1 and int(reply[0]) == 0


def execute(plan: Plan[T]) -> T:
    """Run a plan from synchronous code."""
    if _apart(plan.calls):
        replies = []
        for index, call in enumerate(plan.calls):
            replies.append(run(*call))
            if _refused(plan, index, replies[-1]):
                break
        return plan.read(replies)
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


class _AsyncConnection:
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


_async_connection = _AsyncConnection()
aclose = _async_connection.close


async def arun(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """`run` from the event loop."""
    route, found = _async_connection.route(), library()
    function = found.function(name)
    for attempt in range(LOAD_ATTEMPTS):
        started = time.perf_counter()
        try:
            reply = await route.call(keys, "FCALL", function, len(keys), *keys, *args)
            instruments.loop_batch.observe(instruments.script_timer(name), time.perf_counter() - started)
            return reply
        except redis.RedisError as exc:
            instruments.script_failed(name, exc)
            loadable = isinstance(exc, redis.exceptions.ResponseError) and _not_loaded(exc)
            if not loadable or attempt == LOAD_ATTEMPTS - 1:
                raise
            try:  # on the node that answered (a cluster's: the keys' master)
                await route.call(keys, "FUNCTION", "LOAD", found.code)
            except redis.exceptions.ResponseError as error:
                _loaded(error)
    raise AssertionError("unreachable")


async def aexecute(plan: Plan[T]) -> T:
    """Run a plan from the event loop."""
    if _apart(plan.calls):
        replies = []
        for index, call in enumerate(plan.calls):
            replies.append(await arun(*call))
            if _refused(plan, index, replies[-1]):
                break
        return plan.read(replies)
    return plan.read(_replies(plan.calls, await arun(*plan.call)))


async def apublish(messages: Sequence[tuple[str, bytes]]) -> None:
    """`publish` from the event loop."""
    pipe = _layer.aget().pipeline(transaction=False)
    for channel, payload in messages:
        pipe.publish(channel, payload)
    await pipe.execute()
