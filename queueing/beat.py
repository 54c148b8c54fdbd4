"""Celery beat's scheduler, with a lease: however many beats run, one sends the periodic tasks.

README says to run exactly one beat; a second one (a second `bin/run` on the same Redis, a replica count
of 2, an operator's standby) used to send every periodic task twice. Each beat now takes a lease in Redis
before sending anything (`lua/beat/lease.lua`); one that does not hold it sends nothing and asks again
every second, so it takes over within LEASE_SECONDS of the leader stopping or freezing. A beat that
cannot reach Redis sends nothing (the ticks need Redis anyway).

    CELERY_BEAT_SCHEDULER = "queueing.beat:LeasedScheduler"   (settings.py)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler
from redis.exceptions import RedisError

from . import services

logger = logging.getLogger(__name__)

LEASE_SECONDS = 10.0
ASK_EVERY_SECONDS = 1.0


class BeatLease:
    """Whether this beat leads, asked of Redis at most once a second (the beat's loop ticks more often)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.leading = False
        self._asked = 0.0
        self._said = ""

    def holds(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if now - self._asked < ASK_EVERY_SECONDS:
            return self.leading
        self._asked = now
        try:
            holder = services.beat_lease_hold(self.name, lease_seconds=LEASE_SECONDS)
        except RedisError as exc:
            self.leading = False
            self._say(f"cannot reach Redis ({exc.__class__.__name__}): sending nothing until it answers")
            return False
        self.leading = holder == self.name
        if self.leading:
            self._say(f"beat {self.name} leads: it sends the periodic tasks")
        else:
            self._say(f"beat {holder} leads: {self.name} stands by and takes over if it stops")
        return self.leading

    def _say(self, message: str) -> None:
        if message != self._said:
            logger.warning(message)
            self._said = message


class LeasedScheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler (schedules in the database, tunable in admin), sending only
    while it holds the beat's lease."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lease = BeatLease()
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.lease.holds():
            return ASK_EVERY_SECONDS
        return float(super().tick(*args, **kwargs))
