"""Staff sessions: Django's `cached_db` (the database keeps them, so a flushed cache loses none; reads come
from Redis), with the cache's copy of a session kept at most SESSION_CACHE_SECONDS.

Why the bound: the cache ignores its errors (settings.caches), so a logout while Redis is unreachable
deletes the session from the database but cannot delete the cache's copy; when Redis comes back, that
copy would otherwise log the session in again for the rest of its age. Bounded, it does so for at most
this long, and every session is read again from the database that often.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.sessions.backends import cached_db
from django.core.cache import BaseCache, caches


class _BoundedCache:
    """The session cache, with every entry's timeout cut to `seconds`."""

    def __init__(self, cache: BaseCache, seconds: int) -> None:
        self._cache, self._seconds = cache, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def __contains__(self, key: str) -> bool:
        return key in self._cache

    def _timeout(self, timeout: Any) -> int:
        return max(1, min(int(timeout or self._seconds), self._seconds))

    def set(self, key: str, value: Any, timeout: Any = None) -> None:
        self._cache.set(key, value, self._timeout(timeout))

    async def aset(self, key: str, value: Any, timeout: Any = None) -> None:
        await self._cache.aset(key, value, self._timeout(timeout))


class SessionStore(cached_db.SessionStore):
    def __init__(self, session_key: str | None = None) -> None:
        super().__init__(session_key)
        store: Any = self  # the attribute cached_db reads and writes through
        store._cache = _BoundedCache(caches[settings.SESSION_CACHE_ALIAS], settings.SESSION_CACHE_SECONDS)
