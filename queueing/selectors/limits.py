"""Rate limits on refusals that would otherwise cost the database: scopes limited by default, in code, when
settings.WR_RATE_LIMITS does not name them (an entry there replaces the default; None switches it off).

* `window_miss` (per client address): `/window` reads of a queue with no live window that this process
  does not already know about (a tracked or unknown queue: each would cost a query or two);
* `shuffle` (per client address): the pre-queue shuffle's public record (megabytes once revealed);
* `priority_code` (per client address): joins that carry a priority code, so codes cannot be guessed;
* `notify` (per client address): e-mail addresses left for turn notices, so nobody mails strangers in bulk.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings

from .. import ratelimit, store
from ..clock import now_ms
from ..flows import Flow, drive, execute
from .tickets import limit_decided

DEFAULT_LIMITS: dict[str, dict[str, Any]] = {
    "window_miss": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 60},
    "shuffle": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 60},
    "priority_code": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 600, "max_requests": 20},
    # Wrong codes per queue, from any addresses (issue 50): past it, the queue's codes are locked a while.
    "priority_code_failed": {
        "algorithm": "sliding_window_counter",
        "fixed_window_seconds": 600,
        "max_requests": 200,
    },
    "notify": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 600, "max_requests": 10},
    # ... and per IPv6 /48 (issue 50: one /48 made as many notices as it has /64s)
    "notify_wide": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 600, "max_requests": 100},
}


@lru_cache(maxsize=len(DEFAULT_LIMITS))
def _default_limiter(scope: str) -> ratelimit.Limiter:
    return ratelimit.limiter_from_config(DEFAULT_LIMITS[scope])


def limit_call(scope: str, ident: str, *, now: float | None = None, queue: str = "") -> store.LimitCall | None:
    """The limiter call for one request of `ident` in `scope` (as ratelimit.prepare, with the defaults
    above); None when the scope is not limited."""
    if scope in settings.WR_RATE_LIMITS or scope not in DEFAULT_LIMITS:
        return ratelimit.prepare(scope, ident, now=now, queue=queue)
    limiter = _default_limiter(scope)
    key = store.limit_key(f"{scope}:{limiter.algorithm}", ident, queue=queue)  # as ratelimit.prepare names it
    return store.LimitCall(limiter.algorithm, key, limiter.arguments(now_ms(now)))


def limit_hit(scope: str, ident: str, *, now: float | None = None, queue: str = "") -> ratelimit.Decision:
    """Count one request of `ident` in `scope`: the limiter settings name, else the default above."""
    return ratelimit.counted(limit_call(scope, ident, now=now, queue=queue))


def limit_check(scope: str, ident: str, *, now: float | None = None) -> None:
    """ratelimit.Limited when `ident` is over its limit in `scope` (the request is counted)."""
    drive(limit_flow(limit_call(scope, ident, now=now)))


def limit_flow(call: store.LimitCall | None) -> Flow[None]:
    """Count a request with `call` (from limit_call or ratelimit.prepare) in a round trip of its own;
    ratelimit.Limited when it is over the limit. Nothing to count when `call` is None (not limited)."""
    if call is not None:
        limit_decided((yield from execute(store.limit_plan(call))))
