"""Many nodes against a real Redis Cluster (issue 16). Two `runstack` runs on distinct loopback ports make two
web servers, two websocket servers, two Celery workers and two beats; the live state is on a cluster of
three masters and three replicas (waitingroom_site.devcluster), Celery's broker is RabbitMQ, the channel
layer and the cache a standalone Redis, the database PostgreSQL: each a real server, each test's own (a
database, a queue and a key prefix of its own on the machine's shared servers, removed afterwards).

Six queues, two on each master, take visitors through either web server, with some of them holding a
socket on either websocket server; a protected site verifies and completes their sessions. The promises:
every answer is a 2xx or the API's 503 error shape, the slots in use never exceed capacity, admissions
never exceed what the outflow allows, everyone gets through, and a visitor admitted while its socket is on
either websocket server hears it within 1 s of its admission being published. Then a master is killed
under that load (`kill -9`) after its replica was cut off, so the writes it acknowledged last are lost for
certain: its replica is promoted, and the test measures how long requests failed and how many tickets were
lost and given back their places.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import kombu
import psycopg
import pytest
import redis
from channels_redis.serializers import registry
from django.conf import settings
from redis.crc import key_slot

from queueing.store.connection import cluster_client
from waitingroom_site.devcluster import LocalCluster

from ..stack import ROOT, free_port, product_env, start_runstack
from .load import Load

pytestmark = [pytest.mark.e2e, pytest.mark.together("cluster-farm")]  # one farm for both (see `farm`)

BROKER = os.environ.get("WR_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
POSTGRES = os.environ.get("WR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
CAPACITY, OUTFLOW_PER_MINUTE, BURST = 3, 120, 2
TICK_SECONDS = 1.0  # the beat's admission tick (settings: ticks run every second)


def _missing() -> str:
    """What of the servers this test needs besides its own does not answer ('' when all do)."""
    try:
        with kombu.Connection(BROKER, connect_timeout=3) as connection:
            connection.connect()
    except Exception as exc:  # any failure to connect: no broker to test against
        return f"no RabbitMQ answers at {BROKER} (set WR_TEST_AMQP_URL): {exc!r}"
    try:
        psycopg.connect(POSTGRES, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL answers at {POSTGRES} (set WR_TEST_POSTGRES_URL): {exc!r}"
    return ""


@dataclass
class Node:
    base: str
    ws: str
    log: Path
    process: subprocess.Popen[bytes]


@dataclass
class Farm:
    cluster: LocalCluster
    env: dict[str, str]
    prefix: str
    nodes: list[Node] = field(default_factory=list)

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], env=self.env, cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def connect(self) -> redis.Redis:
        """A client of the live state on the cluster (as the product's own)."""
        return cluster_client(self.cluster.nodes)  # type: ignore[return-value]

    def key(self, slug: str, name: str) -> str:
        return f"{self.prefix}:{{{slug}}}:{name}"

    def logs(self) -> str:
        return "\n".join(f"--- {node.log}\n{node.log.read_text()[-3000:]}" for node in self.nodes)

    def log_marks(self) -> list[int]:
        """Where each node's log ends now (see `logs_since`)."""
        return [node.log.stat().st_size for node in self.nodes]

    def logs_since(self, marks: list[int]) -> list[str]:
        """Each node's log written since `marks` (a test's own part of a farm other tests use too)."""
        pairs = zip(self.nodes, marks, strict=True)
        return [node.log.read_bytes()[mark:].decode(errors="replace") for node, mark in pairs]


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """One farm for the module's tests (its setup, a cluster and two runstacks migrating PostgreSQL, was a
    sixth of the module's time when each test had its own): each test works on queues of its own, and the
    failover test leaves a cluster the other can still use (a promoted replica; every slot served)."""
    tmp_path = tmp_path_factory.mktemp("farm")
    missing = _missing()
    if missing:
        pytest.skip(missing)
    prefix = f"wrn{uuid.uuid4().hex[:6]}"
    database = f"wr_{prefix}"
    with psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    # cluster-node-timeout: 1 s here (a short run); compose's 2 s with WR_FAILOVER_NODE_TIMEOUT_MS=2000, for the
    # figures in docs/deployment.md.
    cluster = LocalCluster(
        tmp_path / "cluster", node_timeout_ms=int(os.environ.get("WR_FAILOVER_NODE_TIMEOUT_MS", "1000"))
    )
    env = product_env(tmp_path, prefix)
    env.pop("CELERY_KEY_PREFIX")  # a Redis broker's option; this broker is RabbitMQ
    env.update(
        DATABASE_URL=f"{POSTGRES.rsplit('/', 1)[0]}/{database}",
        CELERY_BROKER_URL=BROKER,
        ALLOWED_HOSTS="127.0.0.1",
        WEB_WORKERS="1",  # two cores carry both nodes, six Redis nodes and the load
        WORKER_CONCURRENCY="1",
        WR_LIVENESS_GRACE_SECONDS="10",  # the supervisors judge their beats and workers from early on
        WR_RATE_LIMITS=json.dumps(
            {
                "join": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 100000},
                "status": {"algorithm": "token_bucket", "capacity": 1000, "refill_per_second": 1000},
            }
        ),
    )
    found = Farm(cluster, env, prefix)
    try:
        cluster.start()
        env["REDIS_CLUSTER_NODES"] = cluster.nodes
        for index in range(2):  # the second once the first has set the database up
            var = tmp_path / f"node{index}"
            var.mkdir()
            port, ws_port = free_port(), free_port()
            log = var / "run.log"
            node_env = dict(env, WR_VAR_DIR=str(var))
            process = start_runstack(var, node_env, log, port=port, ws_port=ws_port, setup=index == 0)
            node = Node(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{ws_port}", log, process)
            found.nodes.append(node)
            deadline = time.monotonic() + 120
            while "ready." not in log.read_text() or not _healthy(node.base):
                assert process.poll() is None and time.monotonic() < deadline, found.logs()
                time.sleep(0.3)
        yield found
    finally:
        for node in found.nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGINT)
        for node in found.nodes:
            try:
                node.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
        cluster.stop()
        with psycopg.connect(POSTGRES, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        with contextlib.suppress(Exception), kombu.Connection(BROKER) as connection:
            kombu.Queue(env["CELERY_TASK_DEFAULT_QUEUE"], channel=connection.default_channel).delete()
        shared = redis.Redis.from_url(settings.REDIS_URL)
        keys = list(shared.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            shared.delete(*keys)
        shared.close()


def slot_owners(farm: Farm) -> dict[int, int]:
    """Slot -> the port of the master serving it (as a live node sees it)."""
    live = next(port for port, process in farm.cluster.processes.items() if process.poll() is None)
    owners: dict[int, int] = {}
    for start, end, master, *_ in redis.Redis(port=live).execute_command("CLUSTER SLOTS"):
        owners.update(dict.fromkeys(range(int(start), int(end) + 1), int(master[1])))
    return owners


def queues_on_every_master(farm: Farm, tag: str, per_master: int = 2) -> list[str]:
    """Slugs (`tag` in each: a test's own) whose keys (one hash tag each) land on each master in turn,
    `per_master` each."""
    owners = slot_owners(farm)
    chosen: dict[int, list[str]] = {}
    for n in itertools.count():
        slug = f"{tag}{n}-{farm.prefix[-4:]}"
        slugs = chosen.setdefault(owners[key_slot(f"{{{slug}}}".encode())], [])
        if len(slugs) < per_master:
            slugs.append(slug)
        if len(chosen) == 3 and all(len(s) == per_master for s in chosen.values()):
            return [slug for master in sorted(chosen) for slug in chosen[master]]
    raise AssertionError("unreachable")


def open_queues(farm: Farm, slugs: list[str], **options: Any) -> dict[str, str]:
    """Each queue configured (paused) through the first node's settings; its protected site's API key."""
    keys = {}
    for slug in slugs:
        args = ["configure_queue", slug, "--target-url", "https://shop.example/", "--state", "paused"]
        policy = {"capacity": CAPACITY, "outflow_per_minute": OUTFLOW_PER_MINUTE, "burst": BURST}
        policy.update(presence_timeout=300, abandon_timeout=900, claim_ttl=60, session_ttl=120)
        policy.update(options)
        for name, value in policy.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        farm.manage(*args)
        keys[slug] = farm.manage("create_api_key", slug).strip()
    return keys


def open_all(farm: Farm, slugs: list[str]) -> dict[str, float]:
    """Open each queue; when each was opened (admissions may begin from then on)."""
    opened = {}
    for slug in slugs:
        opened[slug] = time.time()
        farm.manage("configure_queue", slug, "--state", "open")
    return opened


def allowed_admissions(opened: float, epochs: int = 1) -> float:
    """The most admissions the policy allows from `opened` until now: a full bucket (burst) at the start of
    each epoch, the outflow since, and one tick's worth for a tick that began before the count was read."""
    return epochs * BURST + OUTFLOW_PER_MINUTE / 60 * (time.time() - opened + TICK_SECONDS)


class Published:
    """When each `admitted` event was published on the channel layer (the standalone Redis): the moment a
    websocket server could first hear of it."""

    def __init__(self, prefix: str) -> None:
        self.at: dict[str, float] = {}
        self._pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
        self._pubsub.psubscribe(f"{prefix}:ws:__group__*")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        serializer = registry.get_serializer("msgpack")
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.2)
            if message and message["type"] == "pmessage":
                event = json.loads(serializer.deserialize(message["data"])["text"])
                if event["type"] == "admitted":
                    self.at.setdefault(event["ticket_id"], time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pubsub.close()


class Socket(threading.Thread):
    """A visitor's socket on one websocket server, hearing its events until `admitted`."""

    def __init__(self, joined: dict[str, Any], ws: str, origin: str) -> None:
        super().__init__(daemon=True)
        self.ticket_id, self.ticket = joined["ticket_id"], joined["ticket"]
        self.url = ws + urlsplit(joined["ws_url"]).path
        self.origin = origin
        self.heard_at: float | None = None
        self.error = ""
        self.stopping = threading.Event()
        self.ready = threading.Event()  # the server joined it to its ticket's events (it answers hello after)

    def run(self) -> None:
        from websockets.sync.client import connect

        try:
            with connect(self.url, additional_headers={"Origin": self.origin}, open_timeout=10) as socket_:
                socket_.send(json.dumps({"type": "hello", "ticket": self.ticket}))
                while not self.stopping.is_set():
                    try:
                        event = json.loads(socket_.recv(timeout=0.5))
                    except TimeoutError:
                        continue
                    if event.get("type") == "ready":
                        self.ready.set()
                    if event.get("type") == "admitted" and event.get("ticket_id") == self.ticket_id:
                        self.heard_at = time.time()
                        return
        except Exception as exc:  # reported by the test, with the ticket
            self.error = repr(exc)


def sockets_for(farm: Farm, answers: list[dict[str, Any]], count: int) -> list[Socket]:
    """Sockets for the first `count` visitors, on each websocket server in turn (whichever web server
    they joined through)."""
    found = []
    for index, joined in enumerate(answers[:count]):
        node = farm.nodes[index % len(farm.nodes)]
        found.append(Socket(joined, node.ws, node.base))
    for socket_ in found:
        socket_.start()
    return found


def admitted_total(farm: Farm, client: redis.Redis, slug: str) -> int:
    return int(client.hget(farm.key(slug, "st"), "admitted") or 0)


def wait_for(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def test_two_of_every_process_on_the_cluster_keep_the_policy_and_every_socket_hears_its_admission(farm):
    marks = farm.log_marks()
    slugs = queues_on_every_master(farm, "n")
    api_keys = open_queues(farm, slugs)
    bases = [node.base for node in farm.nodes]
    loads = {slug: Load(bases, slug, api_keys[slug], farm.connect, farm.prefix) for slug in slugs}
    published = Published(farm.prefix)
    sockets = []
    for load in loads.values():
        sockets += sockets_for(farm, load.join_all(24), 6)
    # Every socket heard: a socket whose hello the server took after its ticket's admission (a busy
    # machine: 36 opened at once) would hear it only from its catch-up read, by when the load may have
    # used and completed the session: it heard `expired`, and the test waited for `admitted` for good.
    assert wait_for(lambda: all(s.ready.is_set() or s.error for s in sockets), 30)
    assert [s.error for s in sockets if s.error] == []
    opened = open_all(farm, slugs)
    began = time.time()
    for load in loads.values():
        load.start(pollers=1)
    everyone = wait_for(lambda: all(len(x.record.admitted_at) == len(x.tickets) for x in loads.values()), 150)
    elapsed = time.time() - began
    for load in loads.values():
        load.stop()
    for socket_ in sockets:
        socket_.stopping.set()
        socket_.join(timeout=5)
    published.stop()

    client = farm.connect()
    figures: dict[str, dict[str, Any]] = {}
    for slug, load in loads.items():
        record = load.record
        admitted = admitted_total(farm, client, slug)
        figures[slug] = {
            "admitted": admitted,
            "allowed": round(allowed_admissions(opened[slug]), 1),
            "most_used": record.most_used,
            "answers": record.answers,
            "violations": record.violations[:5],
            "bounced": record.bounced,
        }
    delays = sorted(
        s.heard_at - published.at[s.ticket_id] for s in sockets if s.heard_at and s.ticket_id in published.at
    )
    summary: dict[str, Any] = {
        "seconds": round(elapsed, 1),
        "queues": figures,
        "sockets": len(sockets),
        "heard_p50_ms": round(delays[len(delays) // 2] * 1000, 1) if delays else None,
        "heard_max_ms": round(delays[-1] * 1000, 1) if delays else None,
    }
    print(json.dumps(summary, indent=2))
    assert everyone, (summary, farm.logs())
    for slug, found in figures.items():
        assert found["violations"] == [], (slug, found)
        assert found["most_used"] <= CAPACITY, (slug, found)
        assert found["admitted"] <= found["allowed"], (slug, found)
    unheard = [(s.ticket_id, s.url, s.error) for s in sockets if s.heard_at is None]
    assert unheard == [], unheard
    assert len(delays) == len(sockets) and delays[-1] <= 1.0, delays[-5:]
    # Both nodes' workers ran ticks from the one broker (each finished tick leaves its worker's liveness mark;
    # the worker's log names the task only in its start-up banner), and sockets were on both websocket servers.
    ticked = [k for k in client.scan_iter(match=f"{farm.prefix}:alive:worker:*") if int(client.get(k)) >= began * 1000]
    assert len(ticked) >= 2, ticked
    assert {urlsplit(s.url).netloc for s in sockets} == {urlsplit(n.ws).netloc for n in farm.nodes}
    # Neither supervisor took a process for stalled: the liveness marks are read where they are written.
    assert not any("is stalled" in log for log in farm.logs_since(marks)), farm.logs()
    # Each node's banner names the cluster its live state is on (issue 51: it named only REDIS_URL).
    banner = f"live state on the Redis Cluster {farm.cluster.nodes}; the rest on Redis {settings.REDIS_URL}"
    assert all(banner in node.log.read_text() for node in farm.nodes), farm.logs()


REPLICATION_SLACK_S = 1.0  # how long before the cut a join's write may still be on its way to the replica
MADE_AGAIN = r"(\d+) of them lost by a failover"  # a web process's count of the completions it made again


def cut_replica(farm: Farm, master_port: int) -> int:
    """The replica of the master at `master_port` stopped (SIGSTOP) and then cut off by the master: what
    the master acknowledges from now on reaches no replica, and a stopped replica cannot link again.
    Returns the replica's port."""
    master = redis.Redis(port=master_port, decode_responses=True)
    replica_port = int(master.info("replication")["slave0"]["port"])
    farm.cluster.processes[replica_port].send_signal(signal.SIGSTOP)
    # Cut from the replica's side before it was stopped, the link was sometimes made again first (seen
    # in CI: "the replica kept its link"); the master closing it is immediate.
    master.client_kill_filter(_type="replica")
    if not wait_for(lambda: master.info("replication")["connected_slaves"] == 0, 10):
        raise AssertionError("the replica kept its link")
    return replica_port


def test_a_master_killed_under_load_fails_over_with_503s_only_and_its_lost_tickets_come_back(farm):
    slugs = queues_on_every_master(farm, "f")
    # A claim or a session whose end the lost writes took (an admission told to its visitor, a completion
    # the site made) holds its slot until its time runs out: short times, so that the run ends soon. The
    # claim's 30 s (and the session's, which may not be shorter): one poller goes round 30-60 tickets, and
    # the failover takes 3-5 s of the window; at 15 s, on a slow host, the first three admitted at the
    # opening were once polled only after their claims had lapsed (the load's fault, not the product's).
    api_keys = open_queues(farm, slugs, claim_ttl=30, session_ttl=30)
    bases = [node.base for node in farm.nodes]
    loads = {slug: Load(bases, slug, api_keys[slug], farm.connect, farm.prefix) for slug in slugs}
    for load in loads.values():
        load.join_all(30)
    opened = open_all(farm, slugs)
    began = time.time()
    for load in loads.values():
        load.start(pollers=1, joins_per_second=2)
    time.sleep(6)

    # The first queue's master: its replica cut off for 2 s of joins, polls and admissions, then the
    # master killed. The replica is promoted without those writes.
    victim = slugs[0]
    owner = slot_owners(farm)[key_slot(f"{{{victim}}}".encode())]
    cutting_at = time.time()
    replica_port = cut_replica(farm, owner)
    cut_at = time.time()
    time.sleep(2)
    killed_at = time.time()
    farm.cluster.kill(owner)
    joined, sent = loads[victim].joined_at, loads[victim].join_sent_at
    # Certainly lost: sent after the cut, so written after it, and answered before the kill.
    lost = {t for t, at in joined.items() if at <= killed_at and sent.get(t, 0) >= cut_at}
    # Perhaps lost: replication is asynchronous, so a join the master answered a moment before the replica
    # stopped may not have reached it (seen once: 4 restored, 3 joined after the cut and none while cutting);
    # and one answered after the cut may have been written before it (seen once: 3 restored of 4 answered
    # after the cut, on a loaded host where a join took a few hundred ms).
    maybe = {t for t, at in joined.items() if cutting_at - REPLICATION_SLACK_S <= at <= killed_at} - lost
    farm.cluster.processes[replica_port].send_signal(signal.SIGCONT)
    assert wait_for(lambda: replica_port in farm.cluster.master_ports() and farm.cluster.healthy(), 30)
    failover_s = time.time() - killed_at
    time.sleep(10)  # the load goes on against the promoted replica
    # Completions the lost writes undid (issue 51: they held their slots until their sessions' ends, 900 s by
    # default): each web process makes its recent ones again once it sees the cluster's epoch move on
    # (WR_FAILOVER_CHECK_SECONDS, 1 s), so none reads as live 10 s after the failover; the sessions' own ends
    # are 20 s and more away yet.
    cut_completions = [token for at, token in loads[victim].record.completed if cutting_at <= at <= killed_at]
    undone = loads[victim].still_live(cut_completions)
    for load in loads.values():
        load.stop_joining()
    everyone = wait_for(lambda: all(len(x.record.admitted_at) == len(x.tickets) for x in loads.values()), 150)
    elapsed = time.time() - began
    for load in loads.values():
        load.stop()

    client = farm.connect()
    record = loads[victim].record
    errors = sorted(at for at in record.errors_at if at >= cut_at)
    restored = int(client.hget(farm.key(victim, "st"), "restored") or 0)
    epoch = int(client.hget(farm.key(victim, "cfg"), "epoch") or 0)
    summary: dict[str, Any] = {
        "failover_s": round(failover_s, 1),
        "errors": len(errors),
        "errors_from_kill_s": round(errors[0] - killed_at, 1) if errors else None,
        "errors_until_s": round(errors[-1] - killed_at, 1) if errors else None,
        "lost_joins": len(lost),
        "maybe_lost_joins": len(maybe),
        "restored": restored,
        "completions_while_cut": len(cut_completions),
        "completions_made_again": sum(
            int(n) for n in re.findall(MADE_AGAIN, "".join(n.log.read_text() for n in farm.nodes))
        ),
        "completions_still_live": len(undone),
        "gone": len(record.lost),
        "bounced": record.bounced,
        "epoch": epoch,
        "answers": {slug: load.record.answers for slug, load in loads.items()},
        "most_used": {slug: load.record.most_used for slug, load in loads.items()},
        "admitted": {slug: admitted_total(farm, client, slug) for slug in slugs},
        "allowed": {slug: round(allowed_admissions(opened[slug], 2 if slug == victim else 1), 1) for slug in slugs},
        "not_through": {slug: len(load.tickets) - len(load.record.admitted_at) for slug, load in loads.items()},
        "violations": {slug: load.record.violations[:5] for slug, load in loads.items()},
        "seconds": round(elapsed, 1),
        "slowest_answer_s": round(max(load.record.slow for load in loads.values()), 2),
    }
    print(json.dumps(summary, indent=2))
    if os.environ.get("WR_FAILOVER_REPORT"):
        Path(os.environ["WR_FAILOVER_REPORT"]).write_text(json.dumps(summary, indent=2))

    assert everyone, (summary, farm.logs())
    for slug, load in loads.items():
        assert load.record.violations == [], (slug, load.record.violations[:5])
        assert load.record.most_used <= CAPACITY, (slug, summary)
        # (the promoted replica may lack the bucket's last spending on the old master: one burst more)
        assert summary["admitted"][slug] <= summary["allowed"][slug], (slug, summary)
    # Requests failed (503 in the error shape, no connection cut, no 500) only while the failover lasted, and
    # a little.
    assert all(set(answers) <= {"2xx", "503"} for answers in summary["answers"].values()), summary
    assert not errors or errors[-1] - killed_at <= failover_s + 5, summary
    assert summary["slowest_answer_s"] < 10, summary
    # Every join the lost writes held was given back its place; no ticket was gone.
    assert len(lost) > 0 and epoch == 2, summary
    assert len(lost) <= restored <= len(lost) + len(maybe) and record.lost == set(), summary
    assert undone == [], summary
