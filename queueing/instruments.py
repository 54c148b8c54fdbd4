"""The process's own Prometheus metrics (README "Metrics"): what each process counts and times as it works.

The figures of each queue (waiting, admitted, capacity, totals, epoch, ...) are read from Redis when
Prometheus scrapes (waitingroom_site/metrics.py); these are the ones only a process can see: its requests,
its Redis calls, its Celery tasks, its sockets and what it pushed to them.

With PROMETHEUS_MULTIPROC_DIR set (runstack sets it for every process it starts), prometheus-client keeps
each value in a file of that directory per process, and whoever serves the directory adds them up: the web
server's /metrics, or a supervisor's WR_METRICS_PORT. The variable is read when the first metric below is
made, so it must be in the environment before the process starts.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import os
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

NAMESPACE = "waitingroom"
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # each process writes its files there: it must exist
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
disable_created_metrics()  # type: ignore[no-untyped-call]  # the *_created series: twice the series, and nothing the dashboards use
# Seconds: a status poll answers in about a millisecond, a tick in a few; a Redis failover takes seconds.
LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TASKS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The wait a visitor had less the wait the page told them at their join: positive, longer than told.
ESTIMATE_ERROR = (-600.0, -300.0, -120.0, -60.0, -30.0, -10.0, 0.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

http_requests = Counter(
    "http_requests",
    "HTTP requests answered, by route, method and status.",
    ["route", "method", "status"],
    namespace=NAMESPACE,
)
http_seconds = Histogram(
    "http_request_duration_seconds",
    "Time to answer an HTTP request, by route.",
    ["route"],
    namespace=NAMESPACE,
    buckets=LATENCY,
)
polls = Counter("polls", "Status polls answered with the ticket's status, by queue.", ["queue"], namespace=NAMESPACE)
rate_limited = Counter("rate_limited", "Requests refused with 429, by limiter scope.", ["scope"], namespace=NAMESPACE)
redis_seconds = Histogram(
    "redis_script_duration_seconds",
    "Time for one Redis script call, by script ('a+b': several in one call).",
    ["script"],
    namespace=NAMESPACE,
    buckets=LATENCY,
)
redis_errors = Counter(
    "redis_errors", "Redis calls that failed, by script and error class.", ["script", "error"], namespace=NAMESPACE
)
push_events = Counter(
    "push_events_sent",
    "Events the websocket server's router wrote to visitors' sockets, by type (one a socket).",
    ["type"],
    namespace=NAMESPACE,
)
estimate_error = Histogram(
    "estimate_error_seconds",
    "At admission: the wait a visitor had less the wait estimated at their join (positive: longer than told).",
    ["queue"],
    namespace=NAMESPACE,
    buckets=ESTIMATE_ERROR,
)
task_seconds = Histogram(
    "celery_task_duration_seconds", "Time a Celery task ran, by task.", ["task"], namespace=NAMESPACE, buckets=TASKS
)
task_failures = Counter("celery_task_failures", "Celery tasks that raised, by task.", ["task"], namespace=NAMESPACE)

# Metrics without labels are made when first used: made at import, each would write its file in
# PROMETHEUS_MULTIPROC_DIR from every process that imports this module (a health check every 15 s, a
# management command), and the directory would fill with files of processes that measured nothing.


@functools.cache
def sockets_open() -> Gauge:
    return Gauge(
        "sockets_open",
        "Visitors' websockets open on the websocket server processes.",
        namespace=NAMESPACE,
        multiprocess_mode="livesum",
    )


@functools.cache
def tick_seconds() -> Histogram:
    return Histogram(
        "tick_duration_seconds",
        "Time for one admission tick over every open queue.",
        namespace=NAMESPACE,
        buckets=TASKS,
    )


@functools.cache
def tick_lag() -> Histogram:
    return Histogram(
        "tick_lag_seconds",
        "From the beat sending an admission tick to a worker starting it.",
        namespace=NAMESPACE,
        buckets=TASKS,
    )


# A labelled child once looked up is kept: `labels()` takes a lock and builds a key on every call, and a
# status poll observes three of them. Every label value here comes from a bounded set (routes, scripts,
# tasks, methods, status codes, queue slugs known to exist), never from a request's text.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@functools.lru_cache(maxsize=4096)
def _http(route: str, method: str, status: int) -> tuple[Any, Any]:
    method = method if method in _METHODS else "other"
    return http_requests.labels(route, method, str(status)), http_seconds.labels(route)


def http_answered(route: str, method: str, status: int, seconds: float) -> None:
    counter, timer = _http(route, method, status)
    counter.inc()
    timer.observe(seconds)


@functools.lru_cache(maxsize=1024)
def script_timer(script: str) -> Any:
    return redis_seconds.labels(script)


def script_failed(script: str, error: BaseException) -> None:
    redis_errors.labels(script, type(error).__name__).inc()


@functools.lru_cache(maxsize=1024)
def poll_counter(queue: str) -> Any:
    return polls.labels(queue)


@functools.lru_cache(maxsize=256)
def _task(task: str) -> Any:
    return task_seconds.labels(task)


def task_ran(task: str, seconds: float) -> None:
    _task(task).observe(seconds)


_EVENT_TYPES = frozenset({"queue_move", "admitted", "expired", "snapshot", "window", "changed", "paused", "resumed"})


def pushed(text: str, sockets: int) -> None:
    """An event the router wrote to `sockets` sockets: counted once per event, not per socket (a fan-out to
    thousands must not pay for a counter each). Its type read from the text's head, as realtime writes it."""
    head = text[:48]  # realtime's events begin {"type": "...", (json.dumps, the type first)
    start = head.find('"type": "') + 9
    kind = head[start : head.find('"', start)] if start >= 9 else ""
    _push(kind if kind in _EVENT_TYPES else "other").inc(sockets)


@functools.lru_cache(maxsize=64)
def _push(kind: str) -> Any:
    return push_events.labels(kind)


class LoopBatch:
    """What the event loop's hot path observes (status polls and joins answered there, their scripts),
    kept as plain numbers and added to the metrics about once a second: observing into prometheus-client's
    multiprocess files costs a lock and a write per bucket and per counter, ~10 µs a poll, which was 5 % of
    a poll's CPU (bench/RESULTS.md). One thread only (the event loop's); up to a second of figures is lost
    when the process ends."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.counts: dict[Any, float] = {}
        self.histograms: dict[Any, list[float]] = {}  # child: [count per bucket..., sum]
        self.due = False  # a flush is scheduled on the loop

    def inc(self, child: Any, amount: float = 1.0) -> None:
        self.counts[child] = self.counts.get(child, 0.0) + amount
        self._schedule()

    def observe(self, child: Any, value: float) -> None:
        entry = self.histograms.get(child)
        if entry is None:
            entry = self.histograms[child] = [0.0] * (len(child._upper_bounds) + 1)
        entry[bisect.bisect_left(child._upper_bounds, value)] += 1  # the first bucket whose bound >= value
        entry[-1] += value
        self._schedule()

    def _schedule(self) -> None:
        if self.due:
            return
        try:
            asyncio.get_running_loop().call_later(self.every, self.flush)
        except RuntimeError:  # no loop running here after all: now
            self.flush()
            return
        self.due = True

    def flush(self) -> None:
        counts, histograms = self.counts, self.histograms
        self.counts, self.histograms, self.due = {}, {}, False
        for child, amount in counts.items():
            child.inc(amount)
        for child, entry in histograms.items():
            for index, count in enumerate(entry[:-1]):
                if count:
                    child._buckets[index].inc(count)
            child._sum.inc(entry[-1])


loop_batch = LoopBatch()


def http_answered_on_loop(route: str, method: str, status: int, seconds: float) -> None:
    """http_answered, batched (LoopBatch): for the event loop's hot path."""
    counter, timer = _http(route, method, status)
    loop_batch.inc(counter)
    loop_batch.observe(timer, seconds)
