"""What Prometheus reads of the live state when it scrapes (README "Metrics"): each queue's figures, and
when the beat last sent an admission tick. Read at the scrape, from Redis and the database, by whichever
web process Prometheus asks: the same for every process, so any one of them will do."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis

from .. import store
from ..models import Queue
from .queues import queue_stats_get

REDIS_FAILURES = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)


@dataclass
class Scrape:
    queues: list[dict[str, Any]] = field(default_factory=list)  # queue_stats_get's figures, and "mode"
    beat_tick_at: float | None = None  # when the beat last sent an admission tick (s since the epoch)
    redis_ok: bool = True
    seconds: float = 0.0  # how long reading took


def scrape_read(*, now: float | None = None) -> Scrape:
    """Every queue's figures (a queue whose state cannot be read is left out), the beat's last tick;
    `redis_ok` False when Redis did not answer (the scrape still answers with what it has)."""
    started = time.perf_counter()
    scrape = Scrape()
    try:
        marked = store.alive_mark_read("beat")
        scrape.beat_tick_at = marked / 1000 if marked else None
        for slug, mode in Queue.objects.order_by("slug").values_list("slug", "mode"):
            scrape.queues.append({**queue_stats_get(slug=slug, now=now), "mode": mode})
    except REDIS_FAILURES:
        scrape.redis_ok = False
    scrape.seconds = time.perf_counter() - started
    return scrape
