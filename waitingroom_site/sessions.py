"""Staff sessions: Django's `cached_db` (the database keeps them, so a flushed cache loses none; reads come
from Redis), with two changes.

* Ending a session must reach the cache. The cache ignores its errors (settings.caches), so a logout
  while Redis is unreachable would delete the session from the database and leave the cache's copy, which
  would log the session in again once Redis is back. Here the copy is deleted first, strictly: if that
  fails, nothing is deleted and the visitor is told to try again (503, waitingroom_site.unavailable), still
  logged in, rather than
  logged out in appearance only.
* The cache's copy of a session is kept at most SESSION_CACHE_SECONDS, so every session is read from
  the database again that often.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.sessions.backends import cached_db
from django.core.cache import BaseCache, caches


class SessionNotEnded(Exception):
    """The cache could not be reached to end the session: it was left as it was."""


class _BoundedCache:
    """The session cache, with every entry's timeout cut to `seconds`."""

    def __init__(self, cache: BaseCache, seconds: int) -> None:
        self._cache, self._seconds = cache, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def __contains__(self, key: str) -> bool:
        return key in self._cache

    def _timeout(self, timeout: Any) -> int:
        """At most the bound; a session with under a second left is not cached (0 expires at once)."""
        return self._seconds if timeout is None else max(0, min(int(timeout), self._seconds))

    def delete_strictly(self, key: str) -> None:
        """Delete whatever the cache's error handling: SessionNotEnded when the cache cannot be reached."""
        client = getattr(self._cache, "client", None)  # django-redis: its client raises, the cache would not
        try:
            if client is not None:
                client.delete(key)  # the key prefix and version applied as the cache would
            else:
                self._cache.delete(key)
        except Exception as exc:
            raise SessionNotEnded(key) from exc

    def set(self, key: str, value: Any, timeout: Any = None) -> None:
        self._cache.set(key, value, self._timeout(timeout))

    async def aset(self, key: str, value: Any, timeout: Any = None) -> None:
        await self._cache.aset(key, value, self._timeout(timeout))


class SessionStore(cached_db.SessionStore):
    def __init__(self, session_key: str | None = None) -> None:
        super().__init__(session_key)
        self._bounded = _BoundedCache(caches[settings.SESSION_CACHE_ALIAS], settings.SESSION_CACHE_SECONDS)
        store: Any = self  # the attribute cached_db reads and writes through
        store._cache = self._bounded

    def delete(self, session_key: str | None = None) -> None:
        key = session_key or self.session_key
        if key is not None:
            self._bounded.delete_strictly(self.cache_key_prefix + key)
        super().delete(session_key)

    async def adelete(self, session_key: str | None = None) -> None:
        key = session_key or self.session_key
        if key is not None:
            await sync_to_async(self._bounded.delete_strictly)(self.cache_key_prefix + key)
        await super().adelete(session_key)
