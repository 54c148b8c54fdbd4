"""What the product keeps in Django's cache (Redis, django-redis; README "Caches"): reads that a shared cache
pays for, each key built here and dropped by the service that changes what it holds.

Everything here is recomputed on a miss, and a cache that cannot be reached is a miss (settings.caches),
so a stale or missing entry costs a query, never a wrong admission. Invalidations run at once and again
after the transaction commits, so a reader between the two cannot keep the old value for long.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import transaction

T = TypeVar("T")
_MISS = object()

SHUFFLE_SECONDS = 60  # the public record of a queue's pre-queue shuffle, without its lists
SHUFFLE_REVEALED_SECONDS = 3600  # a revealed shuffle's lists (they never change; keyed by the commitment)
WINDOW_REFUSED_SECONDS = 5  # "this queue has no public window" (an unknown or tracked queue)
WINDOW_REFUSED_LOCAL_SECONDS = 2.0  # the same, remembered in each process (as a queue's mode is)
SERIES_SECONDS = 60  # a dashboard chart's points, until the next snapshot of the queue


def shuffle_key(slug: str) -> str:
    return f"queue:{slug}:shuffle"


def shuffle_lists_key(slug: str, commitment: str) -> str:
    return f"queue:{slug}:shuffle-lists:{commitment}"


def window_refused_key(slug: str) -> str:
    return f"queue:{slug}:window-refused"


def _series_version_key(queue_pk: int) -> str:
    return f"queue:{queue_pk}:series-version"


def remembered(key: str, compute: Callable[[], T], seconds: int) -> T:
    """The cached value, or `compute()` kept for `seconds` (None is a value too)."""
    value = cache.get(key, _MISS)
    if value is _MISS:
        value = compute()
        cache.set(key, value, seconds)
    return value  # type: ignore[no-any-return]


def cached(key: str) -> Any:
    """The cached value (None when there is none)."""
    return cache.get(key)


def remember(key: str, value: Any, seconds: int) -> None:
    cache.set(key, value, seconds)


def forget(*keys: str) -> None:
    """Drop entries whose source changed: now, and once the change is committed (this process's own copies
    too; other processes keep theirs for at most their few seconds)."""

    def drop() -> None:
        _local_drop(keys)
        cache.delete_many(keys)

    drop()
    transaction.on_commit(drop)


# A few answers are asked for by a crowd at once and are cheap to be briefly wrong about (a 404 for a
# queue that turned stateless a second ago): each process keeps them itself, so asking again costs no
# round trip at all. Bounded: a flood of made-up keys clears it rather than growing it.
_local: dict[str, tuple[float, Any]] = {}
LOCAL_MAX_ENTRIES = 10_000


def local_cached(key: str) -> Any:
    """This process's copy (None when there is none, or it is older than it was kept for)."""
    entry = _local.get(key)
    if entry is None or entry[0] <= time.monotonic():
        return None
    return entry[1]


def local_remember(key: str, value: Any, seconds: float) -> None:
    if len(_local) >= LOCAL_MAX_ENTRIES:
        _local.clear()
    _local[key] = (time.monotonic() + seconds, value)


def _local_drop(keys: tuple[str, ...]) -> None:
    for key in keys:
        _local.pop(key, None)


def series_version(queue_pk: int) -> str | None:
    """The version of a queue's chart points (None: unknown, so not cached)."""
    value: Any = cache.get(_series_version_key(queue_pk))
    return str(value) if value else None


def series_changed(queue_pk: int) -> None:
    """A snapshot was added or pruned: cached chart points of the queue are out of date."""
    cache.set(_series_version_key(queue_pk), uuid.uuid4().hex, None)
