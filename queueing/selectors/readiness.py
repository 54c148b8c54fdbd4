"""Is this process ready to serve (`/readyz`)? Each thing it needs, asked once, briefly: the live state's
Redis (a single server, or every slot of the cluster served), the database, and, told but not required,
how long ago the beat last sent an admission tick."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import DatabaseError, connection

from .. import store


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


# The database's answer, kept DATABASE_CHECK_SECONDS by this process: /readyz is public, and each call ran
# SQL (issue 50). Redis, which decides most outages and costs a PING, is asked every time.
DATABASE_CHECK_SECONDS = 1.0
_database_seen: tuple[float, Check] | None = None


def _database_check(at: float) -> Check:
    global _database_seen
    seen = _database_seen
    if seen is not None and 0 <= at - seen[0] < DATABASE_CHECK_SECONDS:
        return seen[1]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        check = Check(True, connection.vendor)
    except DatabaseError as exc:
        check = Check(False, f"{exc.__class__.__name__}: {exc}"[:200])
    _database_seen = (at, check)
    return check


def readiness(*, now: float | None = None) -> dict[str, Check]:
    """`redis` and `database` decide readiness. `beat` is reported only: a web process with no beat still
    serves joins, polls and the protected site's verifies (admissions wait), and a beat that stops should
    not take every web process out of its load balancer at once; the beat's own probe is
    `python -m waitingroom_site.liveness beat`."""
    now = time.time() if now is None else now
    checks: dict[str, Check] = {}
    try:
        checks["redis"] = Check(True, store.ping())
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        checks["redis"] = Check(False, f"{exc.__class__.__name__}: {exc}"[:200])
    checks["database"] = _database_check(time.monotonic())
    if checks["redis"].ok:
        try:
            marked = store.alive_mark_read("beat")
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
            marked = None
        stale = settings.WR_LIVENESS_STALE_SECONDS
        if marked is None:
            checks["beat"] = Check(False, "no admission tick sent yet")
        else:
            age = max(0.0, now - marked / 1000)
            checks["beat"] = Check(age <= stale, f"last admission tick sent {age:.1f} s ago")
    return checks


REQUIRED = ("redis", "database")
