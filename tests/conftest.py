from __future__ import annotations

import itertools
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from queueing import services, signing_keys, store
from queueing.models import Queue
from queueing.store.connection import cluster_client
from waitingroom_site.devcluster import LocalCluster

from .factories import Clock
from .receivers import Mailbox, smtp_server
from .stack import Stack, run_stack

_slugs = itertools.count(1)


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """Each test starts and ends with no keys under this run's prefix (and never touches other keys)."""
    yield
    _delete_keys(store.client())


def _delete_keys(client: Any) -> None:
    keys = list(client.scan_iter(match=store.key_pattern(), count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real Redis Cluster, three masters and three replicas, from the redis-server binary (free ports, a
    directory of its own), stopped by process id at the end of the run."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["redis", "cluster"])
def live_state(request: pytest.FixtureRequest, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The live state on a single Redis, then on the Redis Cluster (REDIS_CLUSTER_NODES): a module that
    uses it (`pytestmark = pytest.mark.usefixtures("live_state")`) runs each of its tests on both. Processes
    the test spawns find the cluster in their environment (tests/settings.py)."""
    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        settings.REDIS_CLUSTER_NODES = cluster.nodes
        monkeypatch.setenv("WR_TEST_CLUSTER_NODES", cluster.nodes)
        try:
            yield request.param
        finally:  # on the cluster itself, wherever the test pointed the settings
            client = cluster_client(cluster.nodes)
            _delete_keys(client)
            client.close()
    else:
        yield request.param


@pytest.fixture
def redis_away(settings: Any) -> Callable[[], None]:
    """Point the live state at a port nothing listens on: a single Redis's URL, or the cluster's nodes."""

    def away() -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]  # nothing listens there once the probe is closed
        settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
        if settings.REDIS_CLUSTER_NODES:
            settings.REDIS_CLUSTER_NODES = f"127.0.0.1:{port}"

    return away


@pytest.fixture(autouse=True)
def _fresh_key_cache() -> Iterator[None]:
    signing_keys.signing_keys_reset_cache()
    yield
    signing_keys.signing_keys_reset_cache()


@pytest.fixture
def nobody_walks_at_first(settings: Any) -> None:
    """A new queue of an operator with no record of walking away begins from nobody walking away
    (WR_WALK_PRIOR_SHARE 0), not from the default crowd: for tests of how the estimate uses what a queue
    learns, from nothing."""
    settings.WR_WALK_PRIOR_SHARE = 0


@pytest.fixture
def clock() -> Clock:
    return Clock()


QueueFactory = Callable[..., Queue]


@pytest.fixture
def make_queue(db: Any) -> QueueFactory:
    def make(**changes: Any) -> Queue:
        slug = changes.pop("slug", None) or f"q{next(_slugs)}-{uuid.uuid4().hex[:6]}"
        values = {
            "name": f"Queue {slug}",
            "target_url": "https://shop.example/checkout",
            "capacity": 10,
            "outflow_per_minute": 600.0,
            "burst": 10,
            "session_ttl": 600,
            "claim_ttl": 60,
            "presence_timeout": 60,
            "abandon_timeout": 300,
            # Off unless a test turns them on (a scheduled start would otherwise turn them on).
            "max_tickets_per_address": 0,
            "pow_difficulty": 0,
        }
        values.update(changes)
        queue, _ = services.queue_configure(slug=slug, changes=values, actor_label="tests")
        return queue

    return make


@pytest.fixture
def api() -> APIClient:
    return APIClient()


@pytest.fixture
def staff_user(db: Any) -> Any:
    user = get_user_model().objects.create_user("staffer", password="pw-staff-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_queue"))
    return user


@pytest.fixture
def staff_api(staff_user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(staff_user)
    return client


@pytest.fixture
def api_key_for() -> Callable[[Queue], str]:
    def make(queue: Queue) -> str:
        return services.api_key_create(queue, name="site")[1]

    return make


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The real product in subprocesses, as bin/run starts it (see tests/stack.py)."""
    yield from run_stack(tmp_path_factory)


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    """A real SMTP server (aiosmtpd) on a free port, and the product's e-mail settings pointing at it."""
    with smtp_server() as (box, port):
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        yield box


POSTGRES = os.environ.get("WR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """The product's two databases: its default SQLite file, and a PostgreSQL database of this test's own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db.sqlite3'}"
        return
    name = f"wr_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:  # as tests/e2e/test_cluster_nodes.py: only where a PostgreSQL answers
        pytest.skip(f"no PostgreSQL answers at {POSTGRES} (set WR_TEST_POSTGRES_URL): {exc!r}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
