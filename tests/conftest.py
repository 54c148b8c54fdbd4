from __future__ import annotations

import itertools
import json
import os
import resource
import socket
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from queueing import logcontext, services, signing_keys, store
from queueing.models import Queue
from queueing.store.connection import cluster_client
from waitingroom_site.devcluster import LocalCluster

from .factories import Clock
from .receivers import Mailbox, smtp_server
from .stack import Stack, free_port, redis_server, run_stack, stop_process

_slugs = itertools.count(1)

# Each test's time (setup, call and teardown, in seconds) in a whole run, written by `--record-durations`
# (tests whose time is at least a second). The run takes the slowest first: spread over the parallel workers
# (bin/test) from the start, rather than a long one left for the end. `--quick` leaves out those that take
# QUICK_LIMIT or more, with the browser, end-to-end and Cluster runs (tests/README.md).
DURATIONS = Path(__file__).with_name("durations.json")
QUICK_LIMIT = 3.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("waitingroom")
    group.addoption(
        "--quick",
        action="store_true",
        help="the loop between edits: no browser, end-to-end or Cluster runs, nothing known to take "
        f"{QUICK_LIMIT:g} s or more (tests/durations.json)",
    )
    group.addoption("--record-durations", action="store_true", help=f"write each test's time to {DURATIONS.name}")


# First, and pytest-django's own hook (tryfirst too) after it: that one groups the tests by their django_db
# marker, transactional ones last, as Django orders them, and that order is needed: a transactional test
# flushes the database, the groups the migrations made with it, and 17 later tests failed on the missing
# "Queue operators" group when this hook was made to run last (and the run took 12 min 06 s, not 10-11).
# So the slowest come first only within those groups; the faults, failover and e2e sales begin 2-3 minutes in.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    here = Path(__file__).parent
    for item in items:
        package = item.path.relative_to(here).parts[0]
        if package in ("e2e", "browser"):
            item.add_marker(getattr(pytest.mark, package))
    if config.getoption("--quick"):
        quick = [item for item in items if _quick(item, known)]
        config.hook.pytest_deselected(items=[item for item in items if not _quick(item, known)])
        items[:] = quick
    items.sort(key=lambda item: -known.get(item.nodeid, 0.0))  # stable: the rest keep their order
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # (collected in each worker)
    if workers > 1:  # bin/test's --dist worksteal gives each worker one run of the list: deal them out
        items[:] = [item for hand in _dealt(items, workers) for item in hand]


def _dealt(items: list[pytest.Item], hands: int) -> list[list[pytest.Item]]:
    """`items` (slowest first) dealt into `hands` runs of equal length, there and back (0 1 2 2 1 0 ...), so
    that each run holds a like share of the slow ones and starts with its slowest. A worker that finishes
    early takes the later half of another's run (worksteal), the quick end. Tests marked `together(name)`
    go to the run of the first of them (they share a module's costly fixture)."""
    dealt: list[list[pytest.Item]] = [[] for _ in range(hands)]
    groups: dict[str, int] = {}
    index = 0
    for item in items:
        marker = item.get_closest_marker("together")
        if marker is not None and marker.args[0] in groups:
            dealt[groups[marker.args[0]]].append(item)
            continue
        turn, place = divmod(index, hands)
        hand = place if turn % 2 == 0 else hands - 1 - place
        dealt[hand].append(item)
        index += 1
        if marker is not None:
            groups[marker.args[0]] = hand
    return dealt


def _quick(item: pytest.Item, known: dict[str, float]) -> bool:
    callspec = getattr(item, "callspec", None)
    on_cluster = callspec is not None and callspec.params.get("live_state") == "cluster"
    slow = item.get_closest_marker("e2e") or item.get_closest_marker("browser")
    return not on_cluster and not slow and known.get(item.nodeid, 0.0) < QUICK_LIMIT


_durations: dict[str, float] = {}
# When each test's phases ended, on which worker (the controller hears them all): var/test-timeline.tsv, to
# see what a whole run's last minutes were spent on (which tests ran while cores stood idle), and the CPU
# each phase cost (the test process, and its children that ended in it): columns start, seconds, worker,
# phase, test, own CPU, children's CPU.
_timeline: list[tuple[float, float, str, str, str, float, float]] = []
TIMELINE = Path(__file__).parents[1] / "var" / "test-timeline.tsv"


def _cpu() -> tuple[float, float]:
    """CPU seconds (user and system) this process has used, and its children that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


_cpu_mark = [_cpu()]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report carries the CPU the test process used in it, and its children that ended in it
    (a process the test started and stopped; a session's stack counts where it is stopped)."""
    report = yield
    now, then = _cpu(), _cpu_mark[0]
    _cpu_mark[0] = now
    report.user_properties.append(("cpu", (round(now[0] - then[0], 2), round(now[1] - then[1], 2))))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "workerinput", {}).get("workerid", "-")
    cpu: Any = dict(report.user_properties).get("cpu", (0.0, 0.0))
    own, children = float(cpu[0]), float(cpu[1])
    _timeline.append((time.time(), report.duration, worker, report.when or "", report.nodeid, own, children))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # (under pytest-xdist the controller hears every worker's reports, and writes them)
    if _timeline and not session.config.getoption("--quick"):
        began = min(ended - seconds for ended, seconds, *_ in _timeline)
        TIMELINE.parent.mkdir(exist_ok=True)
        TIMELINE.write_text(
            "".join(
                f"{ended - seconds - began:.1f}\t{seconds:.1f}\t{worker}\t{when}\t{nodeid}\t{own}\t{children}\n"
                for ended, seconds, worker, when, nodeid, own, children in sorted(_timeline)
            )
        )
    if not session.config.getoption("--record-durations"):
        return
    slow = {nodeid: round(seconds, 1) for nodeid, seconds in sorted(_durations.items()) if seconds >= 1.0}
    DURATIONS.write_text(json.dumps(slow, indent=0, ensure_ascii=False) + "\n")


@pytest.fixture
def redis_of_its_own(live_state: str, settings: Any) -> Iterator[str]:
    """On the single-Redis side, a redis-server that only this test uses (its URL): for a test that counts
    what the server did (INFO commandstats) or deletes what it holds for all its databases (the scripts'
    library), which other workers' calls on the shared server would change in between (tests/README.md,
    rule 13). A worker's cluster is its own already: on that side, the live state as it is."""
    if live_state == "cluster":
        yield ""
        return
    port = free_port()
    server = redis_server(port)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"  # (settings gives the shared one back first)
    try:
        yield settings.REDIS_URL
    finally:
        stop_process(server, timeout=10)


@pytest.fixture(autouse=True)
def _clean_log_context() -> Iterator[None]:
    """Each test starts outside any request, and leaves no request behind: a request served in the test's
    thread by a client that never closes its response (schemathesis's WSGI calls) keeps its request id
    bound there (it is unbound at request_finished), and a task the next test published "outside any
    request" carried it (seen in a parallel run: tests/test_logs.py)."""
    logcontext.bind(request_id="", queue="", ticket="")  # (not `bound`: it would give back what was there)
    yield
    logcontext.bind(request_id="", queue="", ticket="")


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


# The modules whose tests run on the Redis Cluster too, and why: what they test depends on keys in more
# than one slot, on the cluster client, or on how the product finds its way round the masters. Everything
# else keeps one queue's keys in one slot (one hash tag: test_engine_join checks it), so a cluster adds
# nothing a single Redis does not show (tests/test_cluster.py has the cluster's own: six queues over the
# three masters, a slot moved under the event loop, a master without the scripts). A test that points the
# live state away (`redis_away`) runs on both as well: the cluster client's errors are answered as a
# single Redis's are.
CLUSTER_TOO = {
    "test_engine_join": "the queue's keys share one hash tag; a master without the scripts gets them loaded",
    "test_engine_stateful": "random sequences of every transition, on the library as each master loaded it",
    "test_api_visitors": "a join's address limiter lives in a slot of its own, apart from the queue's",
    "test_ratelimit": "the limiters' keys (by address, by visitor, by key) in slots apart from the queues'",
    "test_fastpath": "the event loop's own connections, one per master, routed by the queue's slot",
    "test_metrics": "the queues' figures gathered from every master (a pipeline per master)",
    "test_readyz": "readiness asks the cluster for its state (CLUSTER INFO), not a node for PONG",
    "test_runstack": "the product's processes given a cluster (REDIS_CLUSTER_NODES) instead of a URL",
    "test_stateless": "a stateless queue's windows and their keys, and that Redis does not grow, per master",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "live_state" not in metafunc.fixturenames:
        return
    both = metafunc.module.__name__.rsplit(".", 1)[-1] in CLUSTER_TOO or "redis_away" in metafunc.fixturenames
    metafunc.parametrize("live_state", ["redis", "cluster"] if both else ["redis"], indirect=True)


@pytest.fixture
def live_state(request: pytest.FixtureRequest, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The live state on a single Redis, and for the modules in CLUSTER_TOO on the Redis Cluster too
    (REDIS_CLUSTER_NODES): a module that uses it (`pytestmark = pytest.mark.usefixtures("live_state")`) runs
    each of its tests on both. Processes the test spawns find the cluster in their environment
    (tests/settings.py)."""
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
