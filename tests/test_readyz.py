"""`/healthz` and `/readyz` (issue 17): a probe for load balancers and orchestrators. Ready while the live
state's Redis (a single server, or a cluster with every slot served) and the database answer; 503 with
Retry-After, quickly, when Redis is stopped, and ready again when it returns. The beat's last tick is told,
not required."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from queueing import services

from .stack import free_port, redis_server

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("live_state")
def test_ready_while_redis_and_the_database_answer_and_the_beat_is_told(client, settings):
    answer = client.get("/readyz")
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    body = answer.json()
    assert body["status"] == "ready"
    assert body["checks"]["redis"]["ok"] and body["checks"]["database"]["ok"]
    expected = "cluster_state:ok" if settings.REDIS_CLUSTER_NODES else "PONG"
    assert body["checks"]["redis"]["detail"] == expected
    services.beat_alive_mark(now=time.time() - 5)
    beat = client.get("/readyz").json()["checks"]["beat"]
    assert beat["ok"] and "5." in beat["detail"]
    services.beat_alive_mark(now=time.time() - 120)
    stale = client.get("/readyz")
    assert stale.status_code == 200 and not stale.json()["checks"]["beat"]["ok"]  # told, not required


@pytest.fixture
def own_redis(settings) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    port = free_port()
    servers = [redis_server(port)]
    settings.REDIS_URL, settings.REDIS_CLUSTER_NODES = f"redis://127.0.0.1:{port}/0", ""
    try:
        yield port, servers
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=10)


def test_not_ready_at_once_while_redis_is_stopped_and_ready_again_when_it_returns(client, own_redis):
    port, servers = own_redis
    assert client.get("/readyz").status_code == 200
    servers[0].terminate()
    servers[0].wait(timeout=10)

    started = time.monotonic()
    answer = client.get("/readyz")
    assert time.monotonic() - started < 2  # refused at once, not held until a timeout
    assert answer.status_code == 503 and answer["Retry-After"] == "5"
    body = answer.json()
    assert body["status"] == "unavailable" and not body["checks"]["redis"]["ok"]
    assert "Connection" in body["checks"]["redis"]["detail"] and body["checks"]["database"]["ok"]
    assert client.get("/healthz").status_code == 200  # the process itself is alive

    servers.append(redis_server(port))
    assert client.get("/readyz").status_code == 200


def test_the_public_reads_only_the_status_and_the_database_is_asked_once_a_second(client, monkeypatch):
    """Issue 50, item 11. Seen: /readyz is public, ran SQL at every call and returned exception text. Its
    checks and version are for whoever may read the metrics; and the database's answer is kept a second."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    readiness = sys.modules["queueing.selectors.readiness"]  # (the package's name `readiness` is its function)
    public = client.get("/readyz", REMOTE_ADDR="203.0.113.9")
    assert public.status_code == 200 and public.json() == {"status": "ready"}
    proxied = client.get("/readyz", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert proxied.json() == {"status": "ready"}
    assert set(client.get("/readyz").json()) == {"status", "version", "checks"}  # from loopback: all of it
    clock = [1000.0]
    monkeypatch.setattr(readiness, "_database_seen", None)
    monkeypatch.setattr(readiness.time, "monotonic", lambda: clock[0])
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            client.get("/readyz", REMOTE_ADDR="203.0.113.9")
        clock[0] += 1.5
        client.get("/readyz", REMOTE_ADDR="203.0.113.9")
    assert [q["sql"] for q in queries.captured_queries].count("SELECT 1") == 2
