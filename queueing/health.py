"""The protected site's health as the adaptive outflow judges it (pure functions, no I/O).

A site reports its responses: how many, how many were server errors (5xx), and their response times.
Times are counted in a log-spaced histogram (bucket i holds times up to 2^(i/4) ms, so neighbouring
bounds are 19% apart), which adds up across web processes and time slices: the p95 of many reports is
the p95 of their summed histograms, never an average of percentiles. `store.health` keeps the counts
in Redis per queue, in one-second slices that expire; services write reports and apply the tick's
decision, selectors read the window.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .models import ADAPTIVE_INTERVAL_MAX_SECONDS, ADAPTIVE_INTERVAL_MIN_SECONDS
from .store import HEALTH_KEEP_SECONDS

BUCKETS_PER_DOUBLING = 4
BUCKET_MAX = 80  # 2^20 ms, about 17 minutes: anything slower is counted here
QUANTILE = 0.95

# Adjustment interval bounds (the queue's adaptive_interval_seconds); reports are kept a little longer
# than the longest window they can be read for, then expire.
INTERVAL_MIN_SECONDS = ADAPTIVE_INTERVAL_MIN_SECONDS
INTERVAL_MAX_SECONDS = ADAPTIVE_INTERVAL_MAX_SECONDS
KEEP_SECONDS = HEALTH_KEEP_SECONDS
if KEEP_SECONDS <= INTERVAL_MAX_SECONDS:
    raise ImproperlyConfigured("Health reports must outlive the longest adjustment interval.")

# What one report may carry (the API refuses more; the middleware never sends more).
REPORT_MAX_SAMPLES = 10_000
REPORT_MAX_REQUESTS = 10_000_000
LATENCY_MAX_MS = 3_600_000.0


def bucket_of(latency_ms: float) -> int:
    """The histogram bucket of one response time."""
    if latency_ms <= 1:
        return 0
    return min(BUCKET_MAX, math.ceil(BUCKETS_PER_DOUBLING * math.log2(latency_ms)))


def bucket_bounds(index: int) -> tuple[float, float]:
    """(lower, upper) response time in ms of a bucket."""
    if index <= 0:
        return 0.0, 1.0
    return 2 ** ((index - 1) / BUCKETS_PER_DOUBLING), 2 ** (index / BUCKETS_PER_DOUBLING)


def histogram(latencies_ms: Sequence[float], *, requests: int) -> dict[int, int]:
    """Bucket counts of the samples, scaled to stand for `requests` responses.

    A busy site may send a sample of its response times with the full count: each sample then weighs
    requests / samples, so a process that served 50,000 requests counts for more than one that served
    100 when their reports are added up. Largest-remainder rounding keeps the total exact.
    """
    if not latencies_ms:
        return {}
    counts = Counter(bucket_of(ms) for ms in latencies_ms)
    total = max(requests, len(latencies_ms))
    if total == len(latencies_ms):
        return dict(counts)
    exact = {index: count * total / len(latencies_ms) for index, count in counts.items()}
    scaled = {index: math.floor(value) for index, value in exact.items()}
    short = total - sum(scaled.values())
    for index in sorted(exact, key=lambda i: (scaled[i] - exact[i], i))[:short]:
        scaled[index] += 1
    return {index: count for index, count in scaled.items() if count > 0}


def quantile_ms(buckets: Mapping[int, int], q: float = QUANTILE) -> float | None:
    """The q-quantile of the response times in a histogram (nearest rank, interpolated linearly inside
    its bucket), or None when there are none."""
    total = sum(count for count in buckets.values() if count > 0)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index in sorted(buckets):
        count = buckets[index]
        if count <= 0:
            continue
        if seen + count >= rank:
            lower, upper = bucket_bounds(index)
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    raise AssertionError("unreachable: the ranks add up to the total")


@dataclass(frozen=True)
class SiteHealth:
    """The site's responses over the last `window_seconds`, summed over every report."""

    window_seconds: int
    requests: int
    errors: int
    latency_samples: int  # responses whose time was reported (the histogram's total)
    p95_ms: float | None  # None: no response times in the window

    @classmethod
    def from_counts(cls, *, window_seconds: int, requests: int, errors: int, buckets: Mapping[int, int]) -> SiteHealth:
        return cls(
            window_seconds=window_seconds,
            requests=requests,
            errors=min(errors, requests),
            latency_samples=sum(buckets.values()),
            p95_ms=quantile_ms(buckets),
        )

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def payload(self) -> dict[str, Any]:
        """As the API and the dashboard show it."""
        rate = self.error_rate
        return {
            "window_seconds": self.window_seconds,
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(rate, 4) if rate is not None else None,
            "p95_latency_ms": round(self.p95_ms, 1) if self.p95_ms is not None else None,
        }


@dataclass(frozen=True)
class Thresholds:
    """When the site counts as unhealthy, and on how much evidence the outflow may be cut."""

    p95_ms: float
    error_rate: float
    min_requests: int

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> Thresholds:
        """From the queue's policy as mirrored into Redis."""
        return cls(
            p95_ms=float(config.get("health_latency_p95_ms") or 1000),
            error_rate=float(config.get("health_error_rate") or 0.05),
            min_requests=int(config.get("adaptive_min_requests") or 1),
        )


INCREASE, DECREASE, HOLD = "increase", "decrease", "hold"


def outflow_verdict(health: SiteHealth, thresholds: Thresholds) -> tuple[str, str]:
    """What the site's health says the outflow should do, and why.

    Unhealthy (p95 or error rate above its threshold) cuts the outflow, but only on at least
    `min_requests` responses: one slow response of two must not halve it. Healthy traffic raises it.
    No traffic says nothing: the outflow stays. (The script that applies the verdict also holds it
    while the queue admits nobody, and does not raise it while nobody waits.)
    """
    if health.requests == 0:
        return HOLD, "no_traffic"
    slow = health.p95_ms is not None and health.p95_ms > thresholds.p95_ms
    failing = (health.error_rate or 0.0) > thresholds.error_rate
    if slow or failing:
        if health.requests < thresholds.min_requests:
            return HOLD, "too_few_requests"
        return DECREASE, "latency_and_errors" if slow and failing else ("latency" if slow else "errors")
    return INCREASE, "healthy"
