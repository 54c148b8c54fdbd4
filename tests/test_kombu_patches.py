"""A Celery worker's broker connection across a Redis shutdown (issue 12, item 1), replayed step by step the
way celery 5.7's consumer handles a lost connection, against a private redis-server that really stops:
messages received and not yet acknowledged, a pidbox-like fanout queue on a second channel (as a worker's
remote control has), SHUTDOWN NOSAVE, then `collect()` and `close()`. Without waitingroom_site/kombu_patches
the close dies with AttributeError("'NoneType' object has no attribute 'hostname'"), which kills the worker."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.common import ignore_errors
from kombu.message import Message

from waitingroom_site import kombu_patches

from .stack import free_port, redis_server


def _start(port: int, directory: Path) -> subprocess.Popen[bytes]:
    return redis_server(port, directory, aof=True)


@pytest.fixture
def broker(tmp_path) -> Iterator[tuple[int, Path]]:
    port = free_port()
    process = _start(port, tmp_path)
    try:
        yield port, tmp_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_corrections_are_written_for_the_pinned_kombu():
    # A new kombu or celery: read the path again (the module's docstring) and adjust PATCHED_VERSIONS.
    assert version("kombu") in kombu_patches.PATCHED_VERSIONS
    assert kombu_patches.apply()


def test_a_consumer_holding_unacknowledged_messages_survives_the_broker_shutting_down(broker):
    port, directory = broker
    assert kombu_patches.apply()
    url = f"redis://127.0.0.1:{port}/0"
    connection = Connection(url)
    connection.connect()
    tasks = Queue("tasks", Exchange("tasks"), "tasks")
    for body in ({"n": 1}, {"n": 2}):
        Producer(connection.channel()).publish(body, exchange=tasks.exchange, routing_key="tasks", declare=[tasks])
    received: list[object] = []
    hold = [lambda body, message: received.append(message)]  # never acknowledged
    Consumer(connection, [tasks], callbacks=hold, prefetch_count=10).consume()
    remote_control = Queue("pidbox", Exchange("pidbox", type="fanout"), auto_delete=True)
    Consumer(connection.channel(), [remote_control], callbacks=[lambda body, message: None]).consume()
    for _ in range(6):
        with contextlib.suppress(socket.timeout):
            connection.drain_events(timeout=0.3)
    assert len(received) == 2  # both held, unacknowledged
    with contextlib.suppress(TimeoutError):
        connection.drain_events(timeout=0.01)  # a BRPOP in flight, as a worker always has

    redis.Redis(port=port).shutdown(nosave=True)
    time.sleep(0.3)
    # celery.worker.consumer.Consumer.on_connection_error_after_connected:
    try:
        connection.collect(socket_timeout=5.0)
    except Exception as exc:  # kombu swallows what it can; what escapes here is not the failure
        assert not isinstance(exc, AttributeError), exc
    ignore_errors(connection, connection.close)  # raised AttributeError without the corrections

    server = _start(port, directory)  # Redis comes back; a new connection consumes again
    try:
        with Connection(url) as again:
            Producer(again.channel()).publish({"n": 3}, exchange=tasks.exchange, routing_key="tasks", declare=[tasks])
            got: list[object] = []

            def take(body: object, message: Message) -> None:
                got.append(body)
                message.ack()

            Consumer(again, [tasks], callbacks=[take]).consume()
            deadline = time.monotonic() + 5
            while {"n": 3} not in got and time.monotonic() < deadline:
                with contextlib.suppress(socket.timeout):
                    again.drain_events(timeout=0.3)
            assert {"n": 3} in got
    finally:
        server.kill()
        server.wait()
