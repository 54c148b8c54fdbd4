"""The Redis client and the script loader: one client per process, every Lua script registered once.

Each atomic transition is one Lua file in `lua/` (the header of each lists its KEYS, ARGV and reply);
`lua/_lib.lua` is prepended to every queue script, with only the functions it uses. Scripts run by
EVALSHA; a server that does not know a script (NOSCRIPT after a restart or SCRIPT FLUSH) gets it loaded
and the call retried once, here and only here: `run` for one script (redis-py's `Script` does it),
`run_together` for a pipeline of several.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from redis.commands.core import Script

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
        url = settings.REDIS_URL
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


def script(name: str) -> Script:
    """The registered script object (tests use it to exercise NOSCRIPT recovery)."""
    return _connection.get()[1][name]


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
