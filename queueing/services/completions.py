"""Completions a Redis Cluster failover may have lost, made again (issue 51).

Redis replicates asynchronously: a master that dies takes with it what it had acknowledged and not yet
sent to its replica, and the replica promoted in its place goes on without it. A completion lost so reads as
a live session again and holds its slot until the session's end (900 s by default): after one failover
under load, 7 of 20 slots were held so and the rest of the sale took half as long again.

So each web process keeps its completions of the last WR_COMPLETION_REPLAY_SECONDS (`Journal.note`), and
looks at the cluster's current epoch every WR_FAILOVER_CHECK_SECONDS (a thread of its own, started by its
first completion). When the epoch has moved on (a failover; or another change of the cluster's
configuration, which loses nothing) it completes them again: one whose end was kept answers 'already' and
changes nothing; one whose end was lost is ended, and its slot goes to the next visitor at once. A lost
completion's slot so comes back within WR_FAILOVER_CHECK_SECONDS (and the replay's own time) of the new
master taking over. What a process that died meanwhile had completed is not made again: those slots come
back at their sessions' ends, as before. A single Redis has no failover: losing its state begins a new
epoch (services/recovery.py), in which the sessions come back only when their visitors verify.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import redis
from django.conf import settings
from django.db import close_old_connections

from .. import store, tokens

logger = logging.getLogger(__name__)

MOST_KEPT = 100_000  # completions kept per process, however many the window would hold


Complete = Callable[[str, tokens.AccessClaims, float], str]  # (slug, claims, now) -> the completion's result


class Journal:
    """One process's recent completions, and what it last knew of the cluster's epoch; `complete` makes one
    again (sessions.session_complete, not kept again)."""

    def __init__(self, complete: Complete) -> None:
        self._complete = complete
        self._recent: deque[tuple[float, str, tokens.AccessClaims]] = deque(maxlen=MOST_KEPT)
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._watcher: threading.Thread | None = None

    def note(self, slug: str, claims: tokens.AccessClaims, *, now: float) -> None:
        """A session of `slug` completed (its end written); kept for a replay while the window lasts. Only
        on a Redis Cluster, and only while the window is set."""
        if not settings.REDIS_CLUSTER_NODES or settings.WR_COMPLETION_REPLAY_SECONDS <= 0:
            return
        with self._lock:
            self._recent.append((now, slug, claims))
            self._forget(now)
            if self._watcher is None or not self._watcher.is_alive():
                self._epoch = self._epoch if self._epoch is not None else _epoch()
                self._watcher = threading.Thread(target=self._watch, name="completions-replay", daemon=True)
                self._watcher.start()

    def _forget(self, now: float) -> None:
        oldest = now - settings.WR_COMPLETION_REPLAY_SECONDS
        while self._recent and self._recent[0][0] < oldest:
            self._recent.popleft()

    def check(self, *, now: float | None = None) -> int:
        """Replay the completions kept when the cluster's epoch has moved on since the last look; how many
        had been lost (and were ended now)."""
        now = time.time() if now is None else now
        epoch = _epoch()
        with self._lock:
            if epoch is None or (self._epoch is not None and epoch <= self._epoch):
                self._epoch = self._epoch if epoch is None else epoch
                return 0
            moved, self._epoch = self._epoch is not None, epoch
            self._forget(now)
            kept = list(self._recent) if moved else []
        again = 0
        for _, slug, claims in kept:
            try:
                again += self._complete(slug, claims, now) == "completed"
            except Exception:  # this one waits for its session's end, as without the replay
                logger.exception("a completion replayed after a failover failed (queue %s)", slug)
        if kept:
            logger.warning(
                "the Redis Cluster's epoch moved on to %s: %s completions of the last %s s made again, %s of them "
                "lost by a failover",
                *(epoch, len(kept), settings.WR_COMPLETION_REPLAY_SECONDS, again),
            )
        return again

    def _watch(self) -> None:
        while True:
            time.sleep(settings.WR_FAILOVER_CHECK_SECONDS)
            try:
                self.check()
            except Exception:
                logger.exception("the check for a failover failed")
            finally:
                close_old_connections()


def _epoch() -> int | None:
    """The cluster's current epoch, as a node that answers tells it; None when none does."""
    try:
        return store.cluster_epoch()
    except redis.RedisError:
        return None
