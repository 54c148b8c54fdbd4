"""Alerts that reach someone (issue 47): the shipped Alertmanager config (deploy/alertmanager) passes amtool's
check, and the shipped chain delivers a shipped rule's alert to a webhook.

End to end, everything is real and the test's own, on free ports with directories of their own, stopped by
pid after: a redis-server, the product on it (`runstack`: granian, uvicorn, Celery worker and beat), Debian's
`prometheus` and `prometheus-alertmanager`, and a webhook receiver (tests/receivers.py). Prometheus runs
the shipped prometheus.yml's rule files and its `alerting:` block (the targets pointed at the test's
Alertmanager; the compose network's scrape jobs replaced by the web job on the running product; 1-s
intervals). Alertmanager runs the shipped alertmanager.yml with only the receiver's URL replaced by the
test's receiver and its group timings shortened.

The product's Redis is stopped (its processes report `waitingroom_redis_up 0`, and the shipped
WaitingRoomRedisUnreachable goes pending) and comes back without its data, as after a crash without its
append-only file: the queue's live state begins a new epoch and the shipped WaitingRoomEpochStarted, which
has no `for:`, fires as shipped. WaitingRoomRedisUnreachable would fire too, after its shipped `for: 1m`:
a minute this test does not spend. No rule is changed for the test.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml

from ..receivers import Receiver
from ..stack import Stack, _healthy, _wait_for, free_port, product_env, start_runstack, stop_process
from .test_faults import RedisServer
from .test_prometheus import _answers, eventually, query

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTMANAGER = ROOT / "deploy" / "alertmanager"
ALERT = "WaitingRoomEpochStarted"
DELIVERED_WITHIN = 90  # seconds from Redis's return to the notification at the webhook


def debian_binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} (Debian's {package} package) is missing: bin/test installs it")
    return found


def amtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [debian_binary("amtool", "prometheus-alertmanager"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


def shipped(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def test_the_shipped_alertmanager_config_passes_amtools_check():
    checked = amtool("check-config", "alertmanager.yml", cwd=ALERTMANAGER)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and " - 1 receivers" in checked.stdout, checked.stdout


def test_amtool_refuses_a_route_to_a_receiver_the_config_does_not_have(tmp_path):
    """The check can fail: the shipped config with its route sent to a receiver it does not define."""
    config = shipped(ALERTMANAGER / "alertmanager.yml")
    config["route"]["receiver"] = "nobody-at-all"
    (tmp_path / "alertmanager.yml").write_text(json.dumps(config))  # JSON is YAML
    refused = amtool("check-config", "alertmanager.yml", cwd=tmp_path)
    assert refused.returncode != 0 and "nobody-at-all" in refused.stdout + refused.stderr


def test_every_alert_goes_to_one_webhook_whose_placeholder_url_never_delivers_until_the_operator_sets_it():
    config = shipped(ALERTMANAGER / "alertmanager.yml")
    assert "routes" not in config["route"]  # no sub-route takes an alert elsewhere
    receiver = {item["name"]: item for item in config["receivers"]}[config["route"]["receiver"]]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["send_resolved"] is True
    host = urlsplit(webhook["url"]).hostname
    assert host is not None and host.endswith(".invalid")  # RFC 2606: resolves nowhere, never the product


@contextmanager
def serving(command: list[str], directory: Path, ready: str) -> Iterator[None]:
    """`command` run with its log in `directory` until `ready` answers 200; stopped by its pid after."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "log"
    with log.open("wb") as out:
        server = subprocess.Popen(command, cwd=directory, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _answers(ready):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield
    finally:
        stop_process(server, timeout=20)


@pytest.fixture
def product(tmp_path: Path) -> Iterator[tuple[Stack, RedisServer]]:
    """The product (runstack, as bin/run starts it) on a redis-server of the test's own."""
    server = RedisServer(tmp_path / "redis")
    var = tmp_path / "product"
    var.mkdir()
    env = product_env(var, f"wra{uuid.uuid4().hex[:8]}")
    env.update(REDIS_URL=server.url, CACHE_URL=server.url.removesuffix("/0") + "/1", ALLOWED_HOSTS="127.0.0.1")
    port, ws_port, log = free_port(), free_port(), var / "stack.log"
    process = start_runstack(var, env, log, port=port, ws_port=ws_port)
    client = redis.Redis.from_url(server.url, decode_responses=True)
    url, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{ws_port}"
    stack = Stack(url, ws_url, env, env["WR_REDIS_PREFIX"], log, process, client)
    try:
        _wait_for(lambda: _healthy(stack.url), 90, "the web server", log)
        _wait_for(lambda: "ready." in log.read_text(), 90, "the Celery worker", log)
        yield stack, server
    finally:
        stop_process(process, timeout=60, signum=signal.SIGINT)  # Ctrl-C: the supervisor stops what it runs
        client.close()
        server.stop()


@pytest.fixture
def webhook() -> Iterator[Receiver]:
    receiver = Receiver()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture
def alertmanager(webhook: Receiver, tmp_path: Path) -> Iterator[str]:
    """Debian's Alertmanager with the shipped config: the receiver's URL the test's, the waits short."""
    config = shipped(ALERTMANAGER / "alertmanager.yml")
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook.url
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1m")
    directory = tmp_path / "alertmanager"
    directory.mkdir()
    (directory / "alertmanager.yml").write_text(json.dumps(config))
    url = f"http://127.0.0.1:{free_port()}"
    command = [
        debian_binary("prometheus-alertmanager", "prometheus-alertmanager"),
        f"--config.file={directory / 'alertmanager.yml'}",
        f"--storage.path={directory / 'data'}",
        f"--web.listen-address={url.removeprefix('http://')}",
        "--cluster.listen-address=",  # one Alertmanager, no gossip port
    ]
    with serving(command, directory, f"{url}/-/ready"):
        yield url


@pytest.fixture
def prometheus(product: tuple[Stack, RedisServer], alertmanager: str, tmp_path: Path) -> Iterator[str]:
    """Debian's Prometheus with the shipped config's rule files and alerting block, scraping the product."""
    stack, _ = product
    config = shipped(PROMETHEUS / "prometheus.yml")
    alerting = config.get("alerting", {})
    for manager in alerting.get("alertmanagers", []):
        for static in manager.get("static_configs", []):
            static["targets"] = [alertmanager.removeprefix("http://")]
    (web,) = [job for job in config["scrape_configs"] if job["job_name"] == "waitingroom-web"]
    del web["dns_sd_configs"]  # compose's DNS: here, the one web server the test runs
    web["static_configs"] = [{"targets": [stack.url.removeprefix("http://")]}]
    config.update(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(PROMETHEUS / name) for name in config["rule_files"]],
            "scrape_configs": [web],
        }
    )
    directory = tmp_path / "prometheus"
    directory.mkdir()
    (directory / "prometheus.yml").write_text(json.dumps(config))
    url = f"http://127.0.0.1:{free_port()}"
    command = [
        debian_binary("prometheus", "prometheus"),
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address={url.removeprefix('http://')}",
    ]
    with serving(command, directory, f"{url}/-/ready"):
        yield url


def notified(webhook: Receiver, alert: str, queue: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(notification, alert) for each firing alert named `alert` about `queue` that the webhook was sent (the
    demo queue bin/run sets up has its own)."""
    return [
        (body, item)
        for body in webhook.bodies()
        for item in body["alerts"]
        if item["labels"]["alertname"] == alert and item["labels"].get("queue") == queue and item["status"] == "firing"
    ]


@pytest.mark.e2e
def test_a_shipped_alert_reaches_the_webhook_when_redis_comes_back_without_the_queues_state(
    product, prometheus, webhook
):
    stack, server = product
    slug = stack.new_queue(state="open", capacity=100, outflow_per_minute=60)
    eventually(prometheus, f'waitingroom_queue_epoch{{queue="{slug}"}}', lambda v: v == 1)
    assert webhook.bodies() == []  # a healthy product: nothing to tell

    server.crash(aof=False)  # SHUTDOWN NOSAVE, no append-only file: the live state is gone
    eventually(prometheus, "waitingroom_redis_up", lambda v: v == 0)
    eventually(prometheus, 'ALERTS{alertname="WaitingRoomRedisUnreachable",alertstate="pending"}', lambda v: v == 1)
    server.start(aof=False)
    back = time.monotonic()

    while not (found := notified(webhook, ALERT, slug)):
        alerts = query(prometheus, "ALERTS")
        assert time.monotonic() - back < DELIVERED_WITHIN, (alerts, webhook.bodies(), stack.log.read_text()[-3000:])
        time.sleep(0.5)
    notification, alert = found[0]
    config = shipped(ALERTMANAGER / "alertmanager.yml")
    assert notification["receiver"] == config["route"]["receiver"] and notification["status"] == "firing"
    assert notification["groupLabels"] == {"alertname": ALERT}  # the shipped route's grouping
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["summary"] == f"Queue {slug} began a new epoch of its live state"
    # The product is whole again: Redis answers its scrapes, the queue runs on its next epoch.
    assert eventually(prometheus, f'waitingroom_queue_epoch{{queue="{slug}"}}', lambda v: v >= 2) == 2
    eventually(prometheus, "waitingroom_redis_up", lambda v: v == 1)
