"""A worker must survive its broker (Redis) going away: two corrections to kombu's Redis transport.

Seen: a Redis restart while a Celery worker held unacknowledged messages ("Restoring N unacknowledged
message(s)") killed the worker with `Unrecoverable error: AttributeError("'NoneType' object has no attribute
'hostname'")`. The path (celery 5.7.0, kombu 5.7.0):

1. On the lost connection the consumer calls `connection.collect()`, which closes the transport's channels
   (`virtual.base.Transport.close_connection`). Closing the pidbox channel raises ConnectionError (its
   `queue_delete` needs the dead server), and that stops the loop: the task channel is left open. The error
   is swallowed, and the transport's `client` set to None.
2. The consumer then calls `connection.close()` (new in celery 5.7.0), which closes the task channel after
   all: its `restore_unacked` rebuilds a connection pool from `transport.client`, now None, and the
   AttributeError is not among the errors `ignore_errors` ignores, so the worker dies.

Corrections: every channel is closed even when one fails (the first error is raised afterwards, as
before), and a channel whose connection was already collected raises a connection error (which every
close and cleanup path ignores, and after which the consumer reconnects) instead of an AttributeError.
Related upstream: celery/kombu#582 (the same AttributeError from `queue_delete`), celery/kombu#970.
tests/test_kombu_patches.py reproduces the path against a real redis-server that is shut down.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as virtual_base

# The versions whose code these corrections were read against; others are left alone (and the test says so).
PATCHED_VERSIONS = ("5.7.0",)
_applied = False


def _close_connection(self: Any, connection: Any) -> None:
    """kombu's Transport.close_connection, except that one channel failing to close leaves no other open."""
    self.cycle.close()
    errors = tuple(self.connection_errors) + tuple(self.channel_errors)
    first: BaseException | None = None
    for channels in (self._avail_channels, self.channels):
        while channels:
            try:
                channel = channels.pop()
            except LookupError:
                continue
            try:
                channel.close()
            except errors as exc:
                first = first or exc
    if first is not None:
        raise first


_original_connparams = kombu_redis.Channel._connparams  # type: ignore[attr-defined]


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if self.connection is None or self.connection.client is None:
        raise redis.exceptions.ConnectionError("the broker connection was already closed")
    return _original_connparams(self, asynchronous=asynchronous)


def apply() -> bool:
    """Install the corrections (once); False when this kombu is not a version they were written for."""
    global _applied
    if _applied:
        return True
    if version("kombu") not in PATCHED_VERSIONS:
        return False
    virtual_base.Transport.close_connection = _close_connection  # type: ignore[method-assign]
    kombu_redis.Channel._connparams = _connparams  # type: ignore[attr-defined]
    _applied = True
    return True
