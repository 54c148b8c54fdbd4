"""The metrics scraped by a real Prometheus (issue 17): Debian's `prometheus`, started by the test on a free
port with its own directory, scraping the real product (bin/run's processes: granian, uvicorn, Celery
worker and beat) at the web's /metrics and at the supervisor's WR_METRICS_PORT; the series asked for over
Prometheus's HTTP API, as a dashboard or an alert would."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from ..stack import Stack, free_port
from .test_stack import join

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("Debian's prometheus package is missing: bin/test installs it")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "deploy/prometheus/alerts.yml")],
        "scrape_configs": [
            {"job_name": "web", "static_configs": [{"targets": [stack.url.removeprefix("http://")]}]},
            {"job_name": "supervisor", "static_configs": [{"targets": [f"127.0.0.1:{stack.metrics_port}"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"{url}/-/ready"):
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=20)
        log.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def value(prometheus: str, expr: str) -> float | None:
    result = query(prometheus, expr)
    return float(result[0]["value"][1]) if result else None


def eventually(prometheus: str, expr: str, ok: Any, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while True:
        found = value(prometheus, expr)
        if found is not None and ok(found):
            return found
        assert time.monotonic() < deadline, (expr, found)
        time.sleep(0.5)


def test_prometheus_scrapes_the_queues_the_requests_redis_celery_and_the_sockets(stack, prometheus):
    slug = stack.new_queue(state="paused", capacity=1000, outflow_per_minute=120, burst=1)
    with stack.client() as client:
        tickets = [join(client, slug).json() for _ in range(8)]
        for ticket in tickets:
            status = client.get(
                f"/api/v1/queues/{slug}/status", headers={"Authorization": f"Bearer {ticket['ticket']}"}
            )
            assert status.status_code == 200
        # One visitor polling far faster than its limiter allows (100 at once, then 20 a second): 429s. In
        # batches of 50 at once, until one is refused: 160 in a row were once all answered, on a host loaded
        # enough that they came slower than the bucket refilled (tests/README.md rule 19).
        headers = {"Authorization": f"Bearer {tickets[0]['ticket']}"}

        def poll(_: int) -> int:
            return client.get(f"/api/v1/queues/{slug}/status", headers=headers).status_code

        refused = 0
        with ThreadPoolExecutor(max_workers=50) as pool:
            for _ in range(40):
                refused += sum(code == 429 for code in pool.map(poll, range(50)))
                if refused:
                    break
    assert refused > 0

    # The queue's own figures, read from Redis at each scrape.
    eventually(prometheus, f'waitingroom_queue_waiting{{queue="{slug}"}}', lambda v: v == 8)
    eventually(prometheus, f'waitingroom_queue_joins_total{{queue="{slug}"}}', lambda v: v == 8)
    eventually(prometheus, f'waitingroom_queue_capacity{{queue="{slug}"}}', lambda v: v == 1000)
    eventually(prometheus, f'waitingroom_queue_state{{queue="{slug}",state="paused",mode="tracked"}}', lambda v: v == 1)
    configured = f'waitingroom_queue_outflow_per_minute{{queue="{slug}",kind="configured"}}'
    eventually(prometheus, configured, lambda v: v == 120)
    assert eventually(prometheus, f'waitingroom_queue_epoch{{queue="{slug}"}}', lambda v: v >= 1) == 1
    eventually(prometheus, 'waitingroom_redis_up{job="web"}', lambda v: v == 1)
    eventually(prometheus, 'time() - waitingroom_beat_last_tick_timestamp_seconds{job="web"}', lambda v: v < 10)

    # The processes' own: requests by route on the hot path, polls by queue, 429s by scope, Redis scripts.
    eventually(
        prometheus, 'sum(waitingroom_http_requests_total{job="web",route="queue-join",status="201"})', lambda v: v >= 8
    )
    eventually(prometheus, f'sum(waitingroom_polls_total{{job="web",queue="{slug}"}})', lambda v: v >= 8)
    eventually(prometheus, 'sum(waitingroom_rate_limited_total{job="web",scope="status"})', lambda v: v >= refused)
    buckets = 'waitingroom_http_request_duration_seconds_bucket{job="web",route="queue-status"}'
    p99 = f"histogram_quantile(0.99, sum by (le) ({buckets}))"  # since the start: the polls came in a burst
    eventually(prometheus, p99, lambda v: 0 < v < 5)
    eventually(
        prometheus,
        'sum(waitingroom_redis_script_duration_seconds_count{job="web",script=~".*status.*"})',
        lambda v: v >= 8,
    )
    # Celery: every admission tick timed, its lag from the beat measured; the same from the supervisor's port.
    for job in ("web", "supervisor"):
        task = (
            f'sum(waitingroom_celery_task_duration_seconds_count{{job="{job}",task="queueing.tasks.admission_tick"}})'
        )
        eventually(prometheus, task, lambda v: v > 0)
        eventually(prometheus, f'sum(waitingroom_tick_lag_seconds_count{{job="{job}"}})', lambda v: v > 0)
    eventually(
        prometheus,
        'histogram_quantile(0.5, sum by (le) (rate(waitingroom_tick_lag_seconds_bucket{job="web"}[1m])))',
        lambda v: v < 1,
    )

    # A socket on the websocket server counts while it is open, and hears events that are counted.
    with connect(tickets[1]["ws_url"], additional_headers={"Origin": stack.url}) as socket_:
        socket_.send(json.dumps({"type": "hello", "ticket": tickets[1]["ticket"]}))
        eventually(prometheus, 'sum(waitingroom_sockets_open{job="web"})', lambda v: v == 1)
        stack.configure(slug, state="open")  # admissions: queue_move events reach the socket
        eventually(prometheus, f'waitingroom_queue_admissions_total{{queue="{slug}"}}', lambda v: v >= 2)
        eventually(prometheus, 'sum(waitingroom_push_events_sent_total{job="web",type="queue_move"})', lambda v: v >= 1)
    eventually(prometheus, 'sum(waitingroom_sockets_open{job="web"})', lambda v: v == 0)
    # The websocket server answers /metrics itself too (compose scrapes each ws container there).
    from_ws = httpx.get(stack.ws_url.replace("ws://", "http://") + "/metrics", timeout=10)
    assert from_ws.status_code == 200 and "waitingroom_push_events_sent_total" in from_ws.text

    # The visitors who joined once admissions had a rate were told a wait: the estimate's error is measured.
    with stack.client() as client:
        for _ in range(3):
            assert join(client, slug).status_code == 201
    eventually(prometheus, f'waitingroom_queue_waiting{{queue="{slug}"}}', lambda v: v == 0, timeout=40)
    eventually(
        prometheus, f'sum(waitingroom_estimate_error_seconds_count{{job="web",queue="{slug}"}})', lambda v: v >= 1
    )

    # The alerting rules load and evaluate against these series (none fires on a healthy product).
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert {rule["name"] for group in rules for rule in group["rules"]} >= {"WaitingRoomAdmissionStalled"}
    assert all(rule["health"] == "ok" for group in rules for rule in group["rules"]), rules
