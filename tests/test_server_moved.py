"""A queue's state found on another server than the one its epoch began on (issue 16; SPEC 3.6): a replica
promoted without the last writes its master had acknowledged, a server started again from its append-only
file. The state survived but for those writes: a new epoch begins over it, the tickets the lost writes had
issued get their places back when their holders poll, numbers resume above everything reserved, and
admissions are not held (the sessions survived with the state).

Real servers only: a master and its replica of the test's own. The replica is stopped (SIGSTOP) while the
master acknowledges joins, then the master is killed (SIGKILL) and the replica resumed and promoted, as a
failover does; so the writes it never received are lost for certain, not by chance.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from queueing import selectors, services, store
from queueing.models import Queue, QueueChange
from queueing.store import TicketStatus

from .factories import access_claims, access_token, join, status
from .stack import free_port, redis_server
from .test_recovery import api_join, api_poll


@dataclass
class Pair:
    """A master and its replica."""

    directory: Path
    master_port: int = field(default_factory=free_port)
    replica_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> Pair:
        for name in ("master", "replica"):  # a replica writes what it syncs into its directory
            (self.directory / name).mkdir()
        self.processes.append(redis_server(self.master_port, self.directory / "master"))
        self.processes.append(redis_server(self.replica_port, self.directory / "replica", replica_of=self.master_port))
        self._until(lambda: self.client(self.replica_port).info("replication")["master_link_status"] == "up")
        return self

    @staticmethod
    def url(port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    @staticmethod
    def _until(done: object, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def in_step(self) -> None:
        """Wait until the replica has every write the master has."""
        master = self.client(self.master_port)
        self._until(lambda: master.wait(1, 1000) == 1)

    def replica_cut(self) -> None:
        """The replica's link to its master cut, and the replica stopped (SIGSTOP) before it makes a new one:
        writes the master acknowledges from now on reach no replica. (Stopping it alone is not enough: what
        the master sent would wait in the replica's socket and be read once it resumes.)"""
        replica, master = self.client(self.replica_port), self.client(self.master_port)
        while True:
            replica.client_kill_filter(_type="master")
            self.processes[1].send_signal(signal.SIGSTOP)
            self._until(lambda: master.info("replication")["connected_slaves"] in (0, 1))
            time.sleep(0.2)  # the master notices the link gone
            if master.info("replication")["connected_slaves"] == 0:
                return
            self.processes[1].send_signal(signal.SIGCONT)  # it linked again in between: once more

    def fail_over(self) -> None:
        """The master dies; the replica, resumed, is promoted (what a failover does)."""
        self.processes[0].kill()
        self.processes[0].wait(timeout=10)
        self.processes[1].send_signal(signal.SIGCONT)
        self.client(self.replica_port).replicaof("NO", "ONE")
        self._until(lambda: self.client(self.replica_port).info("replication")["role"] == "master")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def pair(settings, tmp_path) -> Iterator[Pair]:
    found = Pair(tmp_path).start()
    settings.REDIS_URL = found.url(found.master_port)
    settings.REDIS_CLUSTER_NODES = ""  # servers of the test's own (conftest.live_state)
    try:
        yield found
    finally:
        found.stop()


def seq_of(ticket: dict) -> int:
    return int(ticket["ticket_id"][:10])


def test_tickets_a_promoted_replica_never_received_get_their_places_back(api, make_queue, pair, settings, clock):
    queue = make_queue(state="paused", capacity=2, outflow_per_minute=600, burst=5)
    kept = [api_join(api, queue.slug) for _ in range(3)]
    pair.in_step()
    pair.replica_cut()
    lost = [api_join(api, queue.slug) for _ in range(3)]  # acknowledged by the master alone
    pair.fail_over()
    settings.REDIS_URL = pair.url(pair.replica_port)
    assert {r.seq for r in store.ticket_records(queue.slug)} == {seq_of(t) for t in kept}
    reserved = Queue.objects.get(pk=queue.pk).seq_reserved

    # The first request on the promoted replica sees another server: epoch 2 begins over what survived.
    answers = [api_poll(api, queue.slug, t["ticket"]) for t in reversed(kept + lost)]  # in any order
    assert all(a["status"] == "waiting" and a["epoch"] == 2 for a in answers)
    positions = [api_poll(api, queue.slug, t["ticket"])["position"] for t in kept + lost]
    assert positions == [1, 2, 3, 4, 5, 6]  # the lost ones back at their places
    stats = selectors.queue_stats_get(slug=queue.slug)
    assert stats["totals"]["restored"] == 3 and stats["waiting"] == 6
    change = QueueChange.objects.get(queue=queue, action="epoch")
    assert change.actor_label == "recovery: the queue's live state is on another Redis server"
    assert change.after["admissions_held_seconds"] == 0

    new = api_join(api, queue.slug)
    assert new["position"] == 7 and seq_of(new) == reserved + 1  # no number of the lost writes issued again
    # The sessions survived with the state: nothing to hold admissions for.
    services.queue_configure(slug=queue.slug, changes={"state": "open"}, actor_label="tests")
    services.queues_tick(now=time.time())
    assert [api_poll(api, queue.slug, t["ticket"])["status"] for t in kept] == ["admitted", "admitted", "waiting"]


def test_a_join_is_the_first_to_meet_the_promoted_replica(api, make_queue, pair, settings):
    queue = make_queue(state="paused")
    api_join(api, queue.slug)
    pair.in_step()
    pair.replica_cut()
    lost = api_join(api, queue.slug)
    pair.fail_over()
    settings.REDIS_URL = pair.url(pair.replica_port)

    new = api_join(api, queue.slug)
    assert seq_of(new) > seq_of(lost) and new["position"] == 2
    assert api_poll(api, queue.slug, lost["ticket"])["position"] == 2  # ahead of the new epoch's joiner
    assert api_poll(api, queue.slug, new["ticket"])["position"] == 3
    assert Queue.objects.get(pk=queue.pk).epoch == 2


def test_the_tick_notices_a_server_restarted_from_its_append_only_file(make_queue, settings, tmp_path, clock):
    port = free_port()
    server = redis_server(port, tmp_path, aof=True)
    settings.REDIS_URL, settings.REDIS_CLUSTER_NODES = Pair.url(port), ""
    try:
        queue = make_queue(state="paused")
        tickets = [join(queue.slug, f"v{i}", now=clock()) for i in range(3)]
        server.terminate()
        server.wait(timeout=10)
        server = redis_server(port, tmp_path, aof=True)

        services.queues_tick(now=clock.advance(1))
        assert Queue.objects.get(pk=queue.pk).epoch == 2
        assert QueueChange.objects.get(queue=queue, action="epoch").after["admissions_held_seconds"] == 0
        assert sorted(r.seq for r in store.ticket_records(queue.slug)) == [t.seq for t in tickets]
        services.queues_tick(now=clock.advance(1))  # the epoch runs on this server now: nothing more
        assert Queue.objects.get(pk=queue.pk).epoch == 2
    finally:
        server.kill()
        server.wait(timeout=10)


def test_a_state_whose_epoch_began_before_servers_were_noted_takes_this_one_without_a_new_epoch(make_queue, clock):
    queue = make_queue(state="paused")
    ticket = join(queue.slug, "v", now=clock())
    store.client().hdel(store.queue_keys(queue.slug).cfg, "server")
    # The policy packed again without it, as an older release left it: the first script notes this server.
    assert store.config_write(queue.slug, {}).epoch == 1
    assert store.config_read(queue.slug)["server"]
    services.queues_tick(now=clock.advance(1))
    assert Queue.objects.get(pk=queue.pk).epoch == 1
    assert store.snapshot(queue.slug).waiting == 1 and ticket.seq == 1


def test_a_visit_whose_admission_the_failover_lost_is_completed_with_its_first_token(make_queue, pair, settings, clock):
    # Two slots held at the site; two completions free them for the next two in line. The replica gets
    # none of it: on it the sessions are live and both admissions never happened.
    queue = make_queue(capacity=2, outflow_per_minute=600, burst=5, session_ttl=900)

    def complete(ticket: store.TicketState) -> str:
        claims = access_claims(queue.slug, ticket)
        return services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(1))

    carol, dave = (join(queue.slug, name, now=clock()) for name in ("carol", "dave"))
    ada, bob = (join(queue.slug, name, now=clock()) for name in ("ada", "bob"))
    assert (carol.status, ada.status) == (TicketStatus.ADMITTED, TicketStatus.WAITING)
    pair.in_step()
    pair.replica_cut()
    assert complete(carol) == complete(dave) == "completed"
    ada, bob = (status(queue.slug, t, now=clock()) for t in (ada, bob))
    assert (ada.status, bob.status) == (TicketStatus.ADMITTED, TicketStatus.ADMITTED)
    pair.fail_over()
    settings.REDIS_URL = pair.url(pair.replica_port)

    # Bob's visit ends at the site while the promoted replica has him back at the head of the line: it ends.
    assert complete(bob) == "completed"
    assert status(queue.slug, bob, now=clock()).status == TicketStatus.COMPLETED
    # The site replays a completion the replica lacks: Ada is admitted again, under a newer fence; the
    # site's completion with the token of her first admission ends that visit, and frees its slot.
    assert complete(carol) == "completed"
    again = status(queue.slug, ada, now=clock())
    assert again.status == TicketStatus.ADMITTED and again.fence > ada.fence
    assert complete(ada) == "completed"
    assert status(queue.slug, ada, now=clock()).status == TicketStatus.COMPLETED
    assert complete(ada) == complete(again) == "already"
    assert store.slot_members(queue.slug) == ([dave.ticket_id], [])  # the lost completion's, until replayed
    # The first token's session is over: it does not start again (its admission's link answered `superseded`).
    assert services.session_verify(slug=queue.slug, raw_token=access_token(queue.slug, ada)).reason == "superseded"
