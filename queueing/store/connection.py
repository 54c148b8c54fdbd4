"""The Redis client and the scripts: one client per process, every Lua script in one Redis Functions library.

Each atomic transition is one Lua file in `lua/` (the header of each lists its KEYS, ARGV and reply).
`library()` builds one library of them (FUNCTION LOAD): the shared helpers once (`lua/_lib.lua` and the other
modules of LIB_PARTS, each in a scope of its own: store/lualib.py), then each script's body as a function of
its KEYS and ARGV, registered as a Redis function. The library's code runs once, when it is loaded; before, as
EVALSHA scripts, every call re-created the library's functions and decoded the queue's policy again (a third
of a status poll's Redis time, bench/RESULTS.md). The library's name and its functions' names carry a digest
of its code, so processes of two versions (a rolling deploy) each find their own. A server that does not have
it (a fresh or restarted Redis without persistence, FUNCTION FLUSH) answers "Function not found": the library
is loaded and the call retried, here and only here: `run` for one call, `run_together` for a pipeline, `arun`
from the event loop. Redis 7.0 or later.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import redis
import redis.asyncio
from django.conf import settings
from redis._parsers import CommandsParser
from redis.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from .. import conf, instruments, policy_table
from . import lualib
from .lanes import AsyncConnection, cluster_nodes

T = TypeVar("T")
U = TypeVar("U")

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
# The shared helpers: modules, each in a scope of its own, declaring what it exports (store/lualib.py).
LIB_PARTS = (
    "_lib.lua",
    "_line.lua",
    "_line_upgrade.lua",
    "_policy.lua",
    "_priority.lua",
    "_walkaways.lua",
    "_holds.lua",
    "_estimates.lua",
    "_range.lua",
    "_transitions.lua",
)
# What a part is given at its head, made from Python's own tables: the queue's settings the scripts read
# from the packed policy, in _policy.lua (queueing/policy_table.py).
LIB_GIVEN = {"_policy.lua": lambda: f"local POLICY_SETTINGS = {policy_table.lua_layout()}\n"}


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


def library_parts() -> list[lualib.Part]:
    """The library's shared modules as they are assembled: each one read, with what it is given at its head."""
    read = [lualib.part_read(LUA_DIR / name) for name in LIB_PARTS]
    return [part._replace(body=LIB_GIVEN[part.name]() + part.body) if part.name in LIB_GIVEN else part for part in read]


@lru_cache(maxsize=1)
def library() -> Library:
    lib = lualib.assemble(library_parts())
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


_async_connection = AsyncConnection()
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
