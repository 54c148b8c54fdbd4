"""Prometheus metrics in one process (issue 17): who may read /metrics, what a scrape says of each queue
(read from Redis, on a single Redis and on the cluster), and what the processes count as they work. The
scrape by a real Prometheus of the real processes is tests/e2e/test_prometheus.py."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from waitingroom_site import runstack

from .stack import free_port

pytestmark = pytest.mark.django_db


def scrape(client, **extra) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = client.get("/metrics", **extra)
    assert answer.status_code == 200, answer.content[:300]
    assert answer["Content-Type"].startswith("text/plain; version=")  # the exposition format
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.content.decode())
        for sample in family.samples
    }


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def join(api, slug: str):
    return api.post(f"/api/v1/queues/{slug}/join", format="json", HTTP_X_VISITOR_ID=str(uuid.uuid4()))


@pytest.mark.usefixtures("live_state")
def test_a_scrape_tells_each_queues_figures_read_from_redis(client, api, make_queue):
    queue = make_queue(state="paused", capacity=7, outflow_per_minute=90)
    tickets = [join(api, queue.slug).json() for _ in range(3)]
    api.post(f"/api/v1/queues/{queue.slug}/leave", HTTP_AUTHORIZATION=f"Bearer {tickets[0]['ticket']}")
    figures = scrape(client)
    mine = (("queue", queue.slug),)
    assert figures[("waitingroom_queue_waiting", mine)] == 2
    assert figures[("waitingroom_queue_capacity", mine)] == 7
    assert figures[("waitingroom_queue_joins_total", mine)] == 3
    assert figures[("waitingroom_queue_leaves_total", mine)] == 1
    assert figures[("waitingroom_queue_epoch", mine)] == 1
    outflow = (("kind", "configured"), ("queue", queue.slug))
    assert figures[("waitingroom_queue_outflow_per_minute", outflow)] == 90
    paused = (("mode", "tracked"), ("phase", "paused"), ("queue", queue.slug), ("state", "paused"))
    assert figures[("waitingroom_queue_state", paused)] == 1
    assert figures[("waitingroom_redis_up", ())] == 1


@pytest.mark.usefixtures("live_state")
def test_the_state_carries_the_phase_of_the_sale_so_a_pre_queue_is_not_open(client, make_queue):
    """Issue 47: the metrics said state="open" for a queue in its pre-queue and for one opening tomorrow,
    and the shipped stall alert fired in every healthy pre-queue."""
    now = timezone.now()
    later = make_queue(prequeue_opens_at=now + timedelta(days=1), starts_at=now + timedelta(days=1, hours=1))
    prequeue = make_queue(prequeue_opens_at=now - timedelta(minutes=5), starts_at=now + timedelta(hours=1))
    running = make_queue()
    figures = scrape(client)
    for queue, phase in ((later, "before_prequeue"), (prequeue, "prequeue"), (running, "open")):
        labels = (("mode", "tracked"), ("phase", phase), ("queue", queue.slug), ("state", "open"))
        assert figures[("waitingroom_queue_state", labels)] == 1, (queue.slug, phase)


def test_only_prometheus_may_read_it(client, settings):
    assert client.get("/metrics").status_code == 200  # the test client's address is 127.0.0.1: loopback
    refused = client.get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert refused.status_code == 403 and b"waitingroom_" not in refused.content
    # A proxy's forwarded address is never believed: the peer is what counts.
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="127.0.0.1").status_code == 403
    settings.WR_METRICS_TOKEN = "s3cret-token"
    assert (
        client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200
    )
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 403
    settings.WR_METRICS_NETWORKS = ["203.0.113.0/24"]
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403


@pytest.mark.parametrize(
    "header", [("HTTP_X_FORWARDED_FOR", "203.0.113.7"), ("HTTP_FORWARDED", "for=203.0.113.7"), ("HTTP_X_REAL_IP", "x")]
)
def test_a_request_through_a_proxy_needs_the_token_whatever_its_peer(client, settings, header):
    """Issue 50, item 5. Seen: from 127.0.0.1 with X-Forwarded-For: 203.0.113.7, /metrics answered 200 (84 KB):
    behind a proxy on the same host, or in compose, the peer is the proxy's, so only nginx's exact-path rule
    kept the internet out (and WR_METRICS_PATH moves the view, not that rule)."""
    name, value = header
    refused = client.get("/metrics", REMOTE_ADDR="127.0.0.1", **{name: value})
    assert refused.status_code == 403 and b"waitingroom_" not in refused.content
    settings.WR_METRICS_TOKEN = "s3cret-token"
    given = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer s3cret-token", **{name: value})
    assert given.status_code == 200


def test_with_redis_away_a_scrape_still_answers_and_says_so_and_the_errors_are_counted(
    client, api, make_queue, redis_away
):
    queue = make_queue(state="paused")
    ticket = join(api, queue.slug).json()["ticket"]
    redis_away()
    failed_before = sum(
        value for (name, _), value in scrape(client).items() if name == "waitingroom_redis_errors_total"
    )
    assert api.get(f"/api/v1/queues/{queue.slug}/status", HTTP_AUTHORIZATION=f"Bearer {ticket}").status_code == 503
    figures = scrape(client)
    assert figures[("waitingroom_redis_up", ())] == 0
    assert not any(name == "waitingroom_queue_waiting" for name, _ in figures)  # nothing made up
    failed = sum(value for (name, _), value in figures.items() if name == "waitingroom_redis_errors_total")
    assert failed > failed_before


@pytest.mark.usefixtures("live_state")
def test_requests_are_counted_by_route_and_polls_by_queue_and_429s_by_scope(client, api, make_queue, settings):
    queue = make_queue(state="paused")
    settings.WR_RATE_LIMITS = {
        **settings.WR_RATE_LIMITS,
        "status": {"algorithm": "token_bucket", "capacity": 2, "refill_per_second": 0.001},
    }
    joins = sample("waitingroom_http_requests_total", route="queue-join", method="POST", status="201")
    polls = sample("waitingroom_polls_total", queue=queue.slug)
    limited = sample("waitingroom_rate_limited_total", scope="status")
    status_calls = sample("waitingroom_redis_script_duration_seconds_count", script="status")
    ticket = join(api, queue.slug).json()["ticket"]
    answers = [
        api.get(f"/api/v1/queues/{queue.slug}/status", HTTP_AUTHORIZATION=f"Bearer {ticket}").status_code
        for _ in range(4)
    ]
    assert answers == [200, 200, 429, 429]
    assert sample("waitingroom_http_requests_total", route="queue-join", method="POST", status="201") == joins + 1
    assert sample("waitingroom_polls_total", queue=queue.slug) == polls + 2  # the answered ones
    assert sample("waitingroom_rate_limited_total", scope="status") == limited + 2
    assert sample("waitingroom_redis_script_duration_seconds_count", script="status") >= status_calls  # timed
    assert sample("waitingroom_http_requests_total", route="queue-status", method="GET", status="429") >= 2
    # A path no route matches, and a method nobody uses, do not become labels of their own.
    unmatched = sample("waitingroom_http_requests_total", route="unmatched", method="other", status="404")
    client.generic("BREW", f"/no/such/{uuid.uuid4().hex}")
    assert sample("waitingroom_http_requests_total", route="unmatched", method="other", status="404") == unmatched + 1
    # The staff API's routes by their names.
    before = sample("waitingroom_http_requests_total", route="queue-stats", method="GET", status="401")
    api.get(f"/api/v1/queues/{queue.slug}/stats")
    assert sample("waitingroom_http_requests_total", route="queue-stats", method="GET", status="401") == before + 1


def test_the_supervisor_empties_the_directory_and_serves_what_its_processes_counted(tmp_path):
    """runstack's PROMETHEUS_MULTIPROC_DIR: emptied at the start (an earlier run's files would add up
    with this one's), then served on WR_METRICS_PORT with what processes writing there counted."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"an earlier run's")
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    assert runstack.metrics_directory(env, tmp_path) == directory and list(directory.iterdir()) == []
    script = (
        "from queueing import instruments; instruments.task_ran('queueing.tasks.cleanup', 0.2); "
        "instruments.rate_limited.labels('join').inc(3)"
    )
    for _ in range(2):  # two processes
        subprocess.run([sys.executable, "-c", script], env={**env, "PATH": ""}, check=True)
    port = free_port()
    runstack.metrics_serve({**env, "WR_METRICS_PORT": str(port)}, directory)
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert re.search(r'^waitingroom_rate_limited_total\{scope="join"\} 6\.0$', text, re.M), text
    proxied = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"X-Forwarded-For": "203.0.113.7"}, timeout=5)
    assert proxied.status_code == 403 and "waitingroom_" not in proxied.text  # as the web's /metrics (issue 50)
    assert re.search(
        r'^waitingroom_celery_task_duration_seconds_count\{task="queueing.tasks.cleanup"\} 2\.0$', text, re.M
    )


def test_the_event_loops_batch_adds_up_as_observing_each_would_and_flushes_within_a_second():
    """The hot path's figures are kept as plain numbers and added about once a second (LoopBatch): the same
    buckets, sum and counts as observing each value, and nothing waits for a next request to be flushed."""
    import asyncio

    from prometheus_client import Counter, Histogram

    from queueing import instruments

    name = f"batch_{uuid.uuid4().hex[:8]}"
    direct = Histogram(f"{name}_direct", "direct", buckets=instruments.LATENCY)
    batched = Histogram(f"{name}_batched", "batched", buckets=instruments.LATENCY)
    counter = Counter(f"{name}_count", "batched count")
    values = [0.0001, 0.0005, 0.0007, 0.001, 0.003, 0.049, 0.05, 0.2, 7.0, 30.0]

    async def run() -> None:
        batch = instruments.LoopBatch(every=0.2)
        for value in values:
            direct.observe(value)
            batch.observe(batched, value)
            batch.inc(counter, 2)
        assert sample(f"{name}_count_total") == 0  # not yet
        await asyncio.sleep(0.4)

    asyncio.run(run())
    assert sample(f"{name}_count_total") == 2 * len(values)
    for bound in [*instruments.LATENCY, float("inf")]:
        le = "+Inf" if bound == float("inf") else str(bound)
        assert sample(f"{name}_batched_bucket", le=le) == sample(f"{name}_direct_bucket", le=le), le
    assert sample(f"{name}_batched_sum") == pytest.approx(sum(values))
    assert sample(f"{name}_batched_count") == len(values)


def test_the_supervisor_s_port_admits_only_its_networks_or_the_token(tmp_path):
    """Issue 50, item 5: in compose the supervisor's port listens on 0.0.0.0; it was open to anyone there."""
    import httpx

    directory = tmp_path / "metrics"
    directory.mkdir()
    port = free_port()
    env = {"WR_METRICS_PORT": str(port), "WR_METRICS_NETWORKS": "192.0.2.0/24", "WR_METRICS_TOKEN": "t0ken-t0ken"}
    runstack.metrics_serve(env, directory)
    url = f"http://127.0.0.1:{port}/metrics"
    assert httpx.get(url, timeout=5).status_code == 403  # loopback is not one of its networks here
    assert httpx.get(url, headers={"Authorization": "Bearer t0ken-t0ken"}, timeout=5).status_code == 200
    assert httpx.get(url, headers={"Authorization": "Bearer t0ken"}, timeout=5).status_code == 403


def test_a_taken_metrics_port_is_said_in_one_line_and_the_run_goes_on(tmp_path, capsys):
    import socket as sockets

    with sockets.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runstack.metrics_serve({"WR_METRICS_PORT": str(port)}, tmp_path)
    said = capsys.readouterr().out
    assert f"cannot serve metrics on 127.0.0.1:{port}" in said and "running without them" in said
