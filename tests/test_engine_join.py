"""Joining: sequence, idempotency, placement, immediate admission, closed and full queues."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.conf import settings

from queueing import services, store
from queueing.store import TicketStatus

from .factories import join, rank_of, visitor

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


@pytest.fixture
def paused(make_queue):
    # Paused: joins are accepted and nobody is admitted, so every joiner stays in line.
    return make_queue(state="paused", capacity=5)


def test_joins_get_consecutive_positions_and_sequence_numbers(paused):
    tickets = [join(paused.slug, f"v{i}") for i in range(5)]
    assert [t.rank for t in tickets] == [0, 1, 2, 3, 4]
    assert [t.seq for t in tickets] == [1, 2, 3, 4, 5]
    assert all(t.status == TicketStatus.WAITING for t in tickets)


def test_200_parallel_joins_from_distinct_visitors_get_200_distinct_consecutive_positions(paused):
    with ThreadPoolExecutor(max_workers=32) as pool:
        tickets = list(pool.map(lambda i: join(paused.slug, f"p{i}"), range(200)))
    assert sorted(rank_of(t) for t in tickets) == list(range(200))
    assert len({t.ticket_id for t in tickets}) == 200
    assert sorted(t.seq for t in tickets) == list(range(1, 201))
    assert store.snapshot(paused.slug).waiting == 200


def test_20_parallel_joins_from_one_visitor_get_one_ticket(paused):
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(
            pool.map(lambda _: services.queue_join(slug=paused.slug, visitor_key=visitor("same")), range(20))
        )
    assert len({r.ticket.ticket_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert store.snapshot(paused.slug).waiting == 1
    assert store.snapshot(paused.slug).stats["joined"] == "1"


def test_a_visitor_who_joins_again_gets_its_live_ticket_back_with_its_current_position(paused):
    join(paused.slug, "a")
    first = join(paused.slug, "b")
    again = services.queue_join(slug=paused.slug, visitor_key=visitor("b"))
    assert not again.created
    assert again.ticket.ticket_id == first.ticket_id
    assert again.ticket.rank == 1


def test_a_visitor_whose_ticket_finished_can_join_again_with_a_new_ticket(paused, clock):
    first = join(paused.slug, "a", now=clock())
    store.leave(paused.slug, visitor_key=visitor("a"), seq=first.seq, now_ms=int(clock() * 1000))
    second = join(paused.slug, "a", now=clock())
    assert second.ticket_id != first.ticket_id
    assert second.seq == first.seq + 1


def test_a_closed_queue_refuses_joins(make_queue):
    queue = make_queue(state="closed")
    with pytest.raises(services.QueueClosed):
        join(queue.slug, "late")


def test_a_full_queue_refuses_joins_with_a_retry_hint(make_queue):
    queue = make_queue(state="paused", max_waiting=3)
    for i in range(3):
        join(queue.slug, f"v{i}")
    with pytest.raises(services.QueueFull) as caught:
        join(queue.slug, "fourth")
    assert caught.value.retry_after >= 5
    # Someone already in line is not refused: they get their ticket back.
    assert join(queue.slug, "v1").rank == 1


def test_an_unknown_queue_is_not_found(db):
    with pytest.raises(services.QueueNotFound):
        join("no-such-queue", "x")


def test_a_joiner_of_an_empty_open_queue_with_room_is_admitted_at_once(make_queue):
    queue = make_queue(capacity=2, burst=1)
    ticket = join(queue.slug, "first")
    assert ticket.status == TicketStatus.ADMITTED
    assert ticket.fence > 0
    # The bucket (burst 1) is now empty: the next joiner waits for the tick.
    assert join(queue.slug, "second").status == TicketStatus.WAITING


def test_the_queue_policy_is_restored_from_the_database_when_redis_lost_it(make_queue):
    queue = make_queue(state="paused")
    store.client().delete(store.queue_keys(queue.slug).cfg)
    assert join(queue.slug, "v").status == TicketStatus.WAITING
    assert store.config_read(queue.slug)["state"] == "paused"


def test_all_keys_of_a_queue_share_one_cluster_hash_tag(make_queue):
    queue = make_queue()
    keys = store.queue_keys(queue.slug).script_keys()
    assert len(set(keys)) == len(keys)
    assert all(f"{{{queue.slug}}}" in key for key in keys)
    assert all(key.startswith(store.key_pattern().rstrip("*")) for key in keys)


def lose_the_library(redis_of_its_own: str) -> str:
    """What a restart without persistence or FUNCTION FLUSH does to the scripts: the server forgets them.
    Only on a server of the test's own (the fixture's URL; "" on a cluster, a worker's own already): the
    library is the whole server's, and deleting it on the shared one broke another worker's pipelined
    FCALLs in between ("Function not found" in test_stateless's 100,000 joins, a CI run; tests/README.md,
    rule 13)."""
    assert redis_of_its_own in ("", settings.REDIS_URL), "lose the library on a server of its own"
    name = store.library().name
    with contextlib.suppress(redis.exceptions.ResponseError):  # not loaded (yet)
        store.client().function_delete(name)
    return name


def library_loaded(name: str, *, on: str = "") -> bool:
    """Whether the server has the library (on a cluster: every master, or the master of the key `on`)."""
    client = store.client()
    if isinstance(client, redis.RedisCluster):
        nodes = [client.get_node_from_key(on)] if on else client.get_primaries()
        found = [client.execute_command("FUNCTION LIST", "LIBRARYNAME", name, target_nodes=node) for node in nodes]
    else:
        found = [client.function_list(library=name)]
    # RESP2: each library as a flat key, value list
    return all(
        [dict(zip(entry[::2], entry[1::2], strict=True))["library_name"] for entry in entries] == [name]
        for entries in found
    )


def test_a_server_without_the_scripts_gets_them_loaded_and_the_call_run_again(redis_of_its_own, make_queue):
    queue = make_queue(state="paused")
    name = lose_the_library(redis_of_its_own)
    ticket = join(queue.slug, "after-the-loss")
    assert ticket.rank == 0
    assert library_loaded(name)
