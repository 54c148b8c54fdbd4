"""Prometheus metrics (README "Metrics"): `/metrics` (WR_METRICS_PATH) on every web process, for
Prometheus alone, and the middleware that times each request Django serves.

What a scrape returns:
* every process's own figures (queueing/instruments.py: requests, Redis calls, Celery tasks, sockets,
  pushes, ticks) added up over the processes that share PROMETHEUS_MULTIPROC_DIR with this one (runstack
  gives the processes it starts one directory), or this process's alone when the variable is unset;
* each queue's figures, read from Redis at the scrape (QueueCollector): the same from any web process;
* the build, `waitingroom_build_info` (BuildInfoCollector): the answering process's version, one sample.

Only Prometheus may read it: a request from an address in WR_METRICS_NETWORKS (loopback by default), or
with `Authorization: Bearer <WR_METRICS_TOKEN>`; anyone else gets 403. The address is the connection's
peer, never X-Forwarded-For, and a request that came through a proxy needs the token (metrics_access.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from queueing import instruments, selectors

from . import metrics_access, version


class MetricsMiddleware:
    """Times every request Django answers, by its URL pattern's name (the hot path's answers are timed
    where they are answered, fastpath.py). Outermost but for the request id, so it times the rest."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        instruments.http_answered(
            _route(request), request.method or "", response.status_code, time.perf_counter() - started
        )
        return response


def _route(request: HttpRequest) -> str:
    """The URL pattern's name ('queue-join', 'admin:index'), never the path: a label's values must stay few."""
    match = request.resolver_match
    if match is not None:
        return match.view_name or match.route or "unnamed"
    return str(getattr(request, "route_name", "unmatched"))  # FastPathMiddleware's, answered before resolving


def allowed(request: HttpRequest) -> bool:
    return metrics_access.permitted(
        request.META, allowed=metrics_access.networks(settings.WR_METRICS_NETWORKS), token=settings.WR_METRICS_TOKEN
    )


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponse(
            "Metrics are for Prometheus: from WR_METRICS_NETWORKS (not through a proxy), or with the bearer "
            "WR_METRICS_TOKEN.\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)


def exposition() -> bytes:
    """The text Prometheus reads: the processes' figures, then the build's and the queues'."""
    at_scrape = CollectorRegistry(auto_describe=False)
    at_scrape.register(BuildInfoCollector())
    at_scrape.register(QueueCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        processes = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(processes)  # type: ignore[no-untyped-call]
        return generate_latest(processes) + generate_latest(at_scrape)
    return generate_latest(REGISTRY) + generate_latest(at_scrape)


class BuildInfoCollector(Collector):
    """`waitingroom_build_info{version, python, django} 1`, told at the scrape by the process that answers
    it: a gauge set in each process would, in multiprocess mode, be one file per process to add up."""

    def collect(self) -> Iterator[Metric]:
        build = InfoMetricFamily(f"{instruments.NAMESPACE}_build", "The product's version, its Python's and Django's.")
        build.add_metric([], version.build_info())
        yield build


# (metric, help, the figure in queue_stats_get's answer)
QUEUE_GAUGES = (
    ("waiting", "Visitors in line (those parked as away included).", "waiting"),
    ("waiting_away", "Visitors in line who stopped polling and are parked as away.", "waiting_away"),
    ("admitted", "Visitors admitted who have not yet reached the protected site.", "admitted"),
    ("active", "Sessions on the protected site.", "active"),
    ("capacity", "Concurrent sessions allowed (0: no limit).", "capacity"),
    (
        "capacity_in_use",
        "Sessions counted against capacity (admitted and active, or as the site reports).",
        "capacity_in_use",
    ),
    ("head_position", "The number at the head of the line.", "head_position"),
    ("viewers", "Websockets open on the queue's waiting pages, on every websocket server.", "viewers"),
    (
        "epoch",
        "The queue's epoch: it grows each time the live state is begun again (lost, failed over, moved).",
        "epoch",
    ),
)
# (metric, help, the total in queue_stats_get's answer)
QUEUE_COUNTERS = (
    ("joins", "Visitors who joined, since the epoch began.", "joined"),
    ("admissions", "Visitors admitted, since the epoch began.", "admitted"),
    ("completions", "Sessions completed, since the epoch began.", "completed"),
    ("leaves", "Visitors who left the line, since the epoch began.", "left"),
    ("restored", "Tickets of an earlier epoch given their places back.", "restored"),
    ("leader_changes", "Leader leases taken (a new leader for the queue's ticks).", "leader_terms"),
)
EXPIRY_REASONS = {
    "claim": "expired_claim",
    "session": "expired_session",
    "abandoned": "abandoned",
    "revoked": "revoked",
}
OUTFLOWS = {
    "configured": "outflow_per_minute_configured",
    "in_force": "outflow_per_minute_effective",
    "observed": "outflow_per_minute_observed",
}


class QueueCollector(Collector):
    """Each queue's figures, read from Redis when Prometheus scrapes (selectors.scrape_read)."""

    def collect(self) -> Iterator[Metric]:
        scrape = selectors.scrape_read()
        prefix = instruments.NAMESPACE
        up = GaugeMetricFamily(f"{prefix}_redis_up", "1 when the live state's Redis answered this scrape.")
        up.add_metric([], 1.0 if scrape.redis_ok else 0.0)
        yield up
        took = GaugeMetricFamily(f"{prefix}_scrape_read_seconds", "Time to read every queue's figures.")
        took.add_metric([], scrape.seconds)
        yield took
        if scrape.beat_tick_at is not None:
            beat = GaugeMetricFamily(
                f"{prefix}_beat_last_tick_timestamp_seconds", "When the beat last sent an admission tick."
            )
            beat.add_metric([], scrape.beat_tick_at)
            yield beat
        yield from _queue_families(scrape.queues)


def _queue_families(queues: list[dict[str, Any]]) -> Iterator[Metric]:
    prefix = f"{instruments.NAMESPACE}_queue"
    for name, help_text, figure in QUEUE_GAUGES:
        family = GaugeMetricFamily(f"{prefix}_{name}", help_text, labels=["queue"])
        for queue in queues:
            family.add_metric([queue["slug"]], float(queue.get(figure) or 0))
        yield family
    for name, help_text, total in QUEUE_COUNTERS:
        counter = CounterMetricFamily(f"{prefix}_{name}", help_text, labels=["queue"])
        for queue in queues:
            if total in queue["totals"]:
                counter.add_metric([queue["slug"]], float(queue["totals"][total]))
        yield counter
    expiries = CounterMetricFamily(
        f"{prefix}_expiries",
        "Tickets and sessions that ran out, by reason, since the epoch began.",
        labels=["queue", "reason"],
    )
    outflow = GaugeMetricFamily(
        f"{prefix}_outflow_per_minute",
        "Admissions a minute: as configured, in force (the adaptive outflow's), observed.",
        labels=["queue", "kind"],
    )
    state = GaugeMetricFamily(
        f"{prefix}_state",
        "1 for the queue's state as the operator set it, and its phase: where it is in its sale "
        "(before_prequeue, prequeue, open, paused, closed).",
        labels=["queue", "state", "phase", "mode"],
    )
    waits = GaugeMetricFamily(
        f"{prefix}_average_wait_seconds", "The recent average wait from join to admission.", labels=["queue"]
    )
    for queue in queues:
        slug = queue["slug"]
        for reason, total in EXPIRY_REASONS.items():
            if total in queue["totals"]:
                expiries.add_metric([slug, reason], float(queue["totals"][total]))
        for kind, figure in OUTFLOWS.items():
            outflow.add_metric([slug, kind], float(queue.get(figure) or 0))
        labels = [slug, str(queue.get("state", "unknown")), str(queue.get("phase", "")), str(queue.get("mode", ""))]
        state.add_metric(labels, 1.0)
        if queue.get("average_wait_seconds") is not None:
            waits.add_metric([slug], float(queue["average_wait_seconds"]))
    yield from (expiries, outflow, state, waits)
