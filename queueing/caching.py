"""What the product keeps in Django's cache (Redis, django-redis; README "Caches"): reads that a shared cache
pays for, each key built here and dropped by the service that changes what it holds.

Everything here is recomputed on a miss, and a cache that cannot be reached is a miss (settings.caches),
so a stale or missing entry costs a query, never a wrong admission. Invalidations run at once and again
after the transaction commits, so a reader between the two cannot keep the old value for long.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import transaction

T = TypeVar("T")
_MISS = object()

SHUFFLE_SECONDS = 60  # the public record of a queue's pre-queue shuffle
WINDOW_REFUSED_SECONDS = 5  # "this queue has no public window" (an unknown or tracked queue)
SERIES_SECONDS = 60  # a dashboard chart's points, until the next snapshot of the queue


def shuffle_key(slug: str) -> str:
    return f"queue:{slug}:shuffle"


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
    """Drop entries whose source changed: now, and once the change is committed."""
    cache.delete_many(keys)
    transaction.on_commit(lambda: cache.delete_many(keys))


def series_version(queue_pk: int) -> str | None:
    """The version of a queue's chart points (None: unknown, so not cached)."""
    value: Any = cache.get(_series_version_key(queue_pk))
    return str(value) if value else None


def series_changed(queue_pk: int) -> None:
    """A snapshot was added or pruned: cached chart points of the queue are out of date."""
    cache.set(_series_version_key(queue_pk), uuid.uuid4().hex, None)
