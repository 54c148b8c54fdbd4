"""Rate limiting (SPEC 6.4, seed 002): five algorithms, each one atomic Lua script in Redis.

Use a limiter on its own::

    decision = TokenBucket(capacity=10, refill_per_second=1).hit("some-key")
    if not decision.allowed: ...  # decision.retry_after seconds

or by scope, as the API does (`queueing/api/throttling.py`): `hit("join", client_address)` applies the
limiter that settings.WR_RATE_LIMITS configures for the scope (no entry, or None: unlimited).

The algorithms, as seed 002 defines them:

* token bucket (capacity N, refill R/s): a request takes a token; tokens refill continuously.
* leaking bucket (queue size S, outflow R/s): a request joins a FIFO queue drained at R/s if there is
  room. An HTTP request cannot be held in a queue, so it is let through at once, and the decision says
  when its turn in the queue would have come (`wait`) for callers that pace their own work.
* fixed window counter (window S, max C): at most C per window; up to 2C pass around a boundary.
* sliding window log (max C per window T): request times are logged; a request passes if fewer than C
  are logged in the last T. Refused requests are logged too (`keep_refused`, the seed's rule).
* sliding window counter (fixed window FW, rolling window RW, max C): this window's count plus the
  previous window's count weighted by the rolling window's overlap with it (seed 002's example: 3 in
  this window and 7 in the previous one at 70 % overlap count 3 + 7 x 0.7 = 7.9; the seed prints 6.5,
  which is 3 + 5 x 0.7; tests/test_ratelimit.py checks both), rounded as `rounding` says (down, up or
  none; default settings.WR_RATE_LIMIT_ROUNDING), must stay ≤ C - 1.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from . import conf, store
from .clock import now_ms

ROUNDINGS = ("down", "up", "none")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after: float  # seconds until a request would pass (0 when allowed)
    remaining: float  # tokens, places or requests left; the weighted count for the sliding window counter
    wait: float = 0.0  # leaking bucket: seconds until this request's turn in the queue


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ImproperlyConfigured(f"Rate limit setting {name} must be positive, not {value!r}.")


class Limited(Exception):
    """Refused by a limiter (raised where a limit is checked together with other work)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision)
        self.decision = decision


def decision_from(reply: store.LimitReply) -> Decision:
    return Decision(reply.allowed, reply.retry_ms / 1000, reply.remaining, reply.wait_ms / 1000)


class Limiter:
    algorithm: ClassVar[str]

    def arguments(self, now_ms: int) -> tuple[str | int | float, ...]:
        raise NotImplementedError

    def hit(self, key: str, *, now: float | None = None) -> Decision:
        return decision_from(store.limit_hit(self.algorithm, key, *self.arguments(now_ms(now))))


@dataclass(frozen=True)
class TokenBucket(Limiter):
    algorithm: ClassVar[str] = "token_bucket"
    capacity: float
    refill_per_second: float
    cost: float = 1

    def __post_init__(self) -> None:
        _positive("capacity", self.capacity)
        _positive("refill_per_second", self.refill_per_second)
        _positive("cost", self.cost)

    def arguments(self, now_ms: int) -> tuple[str | int | float, ...]:
        return now_ms, self.capacity, self.refill_per_second, self.cost


@dataclass(frozen=True)
class LeakingBucket(Limiter):
    algorithm: ClassVar[str] = "leaking_bucket"
    size: int
    outflow_per_second: float

    def __post_init__(self) -> None:
        _positive("size", self.size)
        _positive("outflow_per_second", self.outflow_per_second)

    def arguments(self, now_ms: int) -> tuple[str | int | float, ...]:
        return now_ms, self.size, self.outflow_per_second


@dataclass(frozen=True)
class FixedWindow(Limiter):
    algorithm: ClassVar[str] = "fixed_window"
    window_seconds: float
    max_requests: int

    def __post_init__(self) -> None:
        _positive("window_seconds", self.window_seconds)
        _positive("max_requests", self.max_requests)

    def arguments(self, now_ms: int) -> tuple[str | int | float, ...]:
        return now_ms, round(self.window_seconds * 1000), self.max_requests


@dataclass(frozen=True)
class SlidingLog(Limiter):
    algorithm: ClassVar[str] = "sliding_log"
    window_seconds: float
    max_requests: int
    keep_refused: bool = True

    def __post_init__(self) -> None:
        _positive("window_seconds", self.window_seconds)
        _positive("max_requests", self.max_requests)

    def arguments(self, now_ms: int) -> tuple[str | int | float, ...]:
        member = uuid.uuid4().hex[:12]  # two requests in one millisecond are two entries
        return now_ms, round(self.window_seconds * 1000), self.max_requests, member, int(self.keep_refused)


@dataclass(frozen=True)
class SlidingWindowCounter(Limiter):
    algorithm: ClassVar[str] = "sliding_window_counter"
    fixed_window_seconds: float
    max_requests: int
    rolling_window_seconds: float = 0  # 0: the same as the fixed window
    rounding: str = field(default_factory=lambda: str(settings.WR_RATE_LIMIT_ROUNDING))

    def __post_init__(self) -> None:
        _positive("fixed_window_seconds", self.fixed_window_seconds)
        _positive("max_requests", self.max_requests)
        if not self.rolling_window_seconds:
            object.__setattr__(self, "rolling_window_seconds", self.fixed_window_seconds)
        if not self.fixed_window_seconds <= self.rolling_window_seconds <= 2 * self.fixed_window_seconds:
            raise ImproperlyConfigured("rolling_window_seconds must lie between the fixed window and twice it.")
        if self.rounding not in ROUNDINGS:
            raise ImproperlyConfigured(f"rounding must be one of {', '.join(ROUNDINGS)}, not {self.rounding!r}.")

    def arguments(self, now_ms: int) -> tuple[str | int | float, ...]:
        fw, rw = round(self.fixed_window_seconds * 1000), round(self.rolling_window_seconds * 1000)
        return now_ms, fw, rw, self.max_requests, self.rounding


ALGORITHMS: dict[str, type[Limiter]] = {
    cls.algorithm: cls for cls in (TokenBucket, LeakingBucket, FixedWindow, SlidingLog, SlidingWindowCounter)
}


def limiter_from_config(config: dict[str, Any]) -> Limiter:
    """A limiter from a settings entry: {"algorithm": "token_bucket", "capacity": 10, ...}."""
    options = dict(config)
    name = options.pop("algorithm", None)
    if name not in ALGORITHMS:
        raise ImproperlyConfigured(f"Unknown rate limit algorithm {name!r}; use one of {', '.join(ALGORITHMS)}.")
    try:
        return ALGORITHMS[name](**options)
    except TypeError as exc:
        raise ImproperlyConfigured(f"Rate limit {name}: {exc}") from exc


_in_force: dict[str, tuple[dict[str, Any], Limiter | None]] = {}


def scope_limiter(scope: str) -> Limiter | None:
    """The limiter settings configure for a scope (kept while its configuration stays the same: a poll
    asks, and comparing the configuration costs less than building a limiter), or None: unlimited."""
    config = conf.hot().WR_RATE_LIMITS.get(scope) or {}
    known = _in_force.get(scope)
    if known is not None and known[0] == config:
        return known[1]
    limiter = limiter_from_config(config) if config else None
    _in_force[scope] = (dict(config), limiter)
    return limiter


def prepare(scope: str, ident: str, *, now: float | None = None, queue: str = "") -> store.LimitCall | None:
    """The limiter call for one request of `ident` in `scope`, to run with other work in one round trip
    (a status poll's plan does: `queue` is then the queue whose ticket `ident` is, so the limiter's key
    shares its hash tag); None when the scope is not limited. Read the result with decision_from."""
    limiter = scope_limiter(scope)
    if limiter is None:
        return None
    # The algorithm is part of the key: an operator who switches a scope to another algorithm must not
    # meet the old one's state (another Redis type) in its place.
    key = store.limit_key(f"{scope}:{limiter.algorithm}", ident, queue=queue)
    return store.LimitCall(limiter.algorithm, key, limiter.arguments(now_ms(now)))


def hit(scope: str, ident: str, *, now: float | None = None, queue: str = "") -> Decision:
    """Count one request of `ident` (a client address, ticket, API key or user) in `scope` (with `queue`:
    for that queue alone, as `prepare`)."""
    return counted(prepare(scope, ident, now=now, queue=queue))


def counted(call: store.LimitCall | None) -> Decision:
    """Run a prepared limiter call on its own (None: not limited, always allowed)."""
    if call is None:
        return Decision(True, 0, float("inf"))
    return decision_from(store.limit_hit(call.algorithm, call.key, *call.args))
