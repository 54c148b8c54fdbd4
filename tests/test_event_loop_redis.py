"""The event loop's connections to Redis (store.connection._Lane): a Redis that stops answering fails the
command in time, a Redis that restarted is reconnected to, and nothing is left waiting."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import redis

from queueing.store import connection

from .stack import redis_server


def stop_process(process) -> None:
    process.terminate()
    process.wait(10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def private_redis(tmp_path, settings, monkeypatch):
    port = _free_port()
    server = redis_server(port, tmp_path)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    monkeypatch.setattr(connection, "LANE_TIMEOUT_SECONDS", 1.0)
    yield port, server
    stop_process(server)


@pytest.mark.asyncio
async def test_a_redis_that_stops_answering_fails_the_command_within_its_timeout(private_redis):
    port, _ = private_redis
    lane = connection._async_connection.lane()
    assert await lane.command("PING") in (True, "PONG")
    redis.Redis(port=port).execute_command("CLIENT", "PAUSE", "2500", "ALL")
    started = time.monotonic()
    with pytest.raises(redis.exceptions.TimeoutError):
        await lane.command("PING")
    assert 1.0 <= time.monotonic() - started < 2.2  # the deadline and the watchdog's period, not forever
    await asyncio.sleep(1.6)  # the pause is over: a new connection answers
    assert await lane.command("SET", "k", "v") in (True, "OK")
    await connection.aclose()


@pytest.mark.asyncio
async def test_a_restarted_redis_is_reconnected_to_and_an_error_reply_keeps_the_connection(private_redis, tmp_path):
    port, server = private_redis
    lane = connection._async_connection.lane()
    assert await lane.command("SET", "k", "1") in (True, "OK")
    with pytest.raises(redis.exceptions.ResponseError):
        await lane.command("INCR", "nope", "extra")  # wrong arity: an error reply, the connection stays good
    assert await lane.command("INCR", "k") == 2
    stop_process(server)
    private = redis_server(port, tmp_path)
    try:
        # The kept connection is dead: the command goes once more on a new one (it cannot have run).
        assert await lane.command("INCR", "counter") == 1
    finally:
        await connection.aclose()
        stop_process(private)
