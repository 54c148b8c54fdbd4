"""Liveness marks: when the beat last sent an admission tick, and when each Celery worker last ran one;
and the lease that lets only one beat send the periodic tasks.

Plain strings with an expiry, one per process role and name (no hash tag: each is read on its own). They
are read without Django by `waitingroom_site/liveness.py`, which builds the same names from the same
prefix, to tell a stalled worker from a healthy one; tests check that the two agree.
"""

from __future__ import annotations

from django.conf import settings

from .connection import client, run

# A mark outlives any staleness threshold an operator would choose, then goes with its process.
KEEP_SECONDS = 600


def alive_key(role: str, name: str = "") -> str:
    """`<prefix>:alive:beat`, `<prefix>:alive:worker:<node name>`."""
    return f"{settings.WR_REDIS_PREFIX}:alive:{role}" + (f":{name}" if name else "")


def alive_mark(role: str, name: str = "", *, now_ms: int) -> None:
    client().set(alive_key(role, name), now_ms, ex=KEEP_SECONDS)


def beat_lease(name: str, *, lease_ms: int) -> str:
    """Take or keep the beat's lease for `name`; the name of the beat holding it afterwards."""
    return str(run("beat/lease", [f"{settings.WR_REDIS_PREFIX}:beat:lease"], [name, lease_ms]))
