"""Liveness marks for the supervisor and the containers' health checks (`waitingroom_site/liveness.py`):
the beat notes each admission tick it sends, a worker each tick it has run. And the beat's lease: of
several beats started by mistake (or on purpose, as standbys), one sends the periodic tasks."""

from __future__ import annotations

from .. import store
from ..clock import now_ms


def worker_alive_mark(name: str, *, now: float | None = None) -> None:
    store.alive_mark("worker", name, now_ms=now_ms(now))


def beat_alive_mark(*, now: float | None = None) -> None:
    store.alive_mark("beat", now_ms=now_ms(now))


def beat_lease_hold(name: str, *, lease_seconds: float) -> str:
    """Take or keep the beat's lease; returns who holds it (`name` when this beat leads)."""
    return store.beat_lease(name, lease_ms=int(lease_seconds * 1000))
