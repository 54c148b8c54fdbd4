"""The live state on a real Redis Cluster (three masters, three replicas: conftest.redis_cluster): queues
spread over every master, each running whole on its own; the event loop's lanes following a slot that
moves (ASK while it moves, MOVED once it has); a master without the library; the orphan sweep."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, cast

import pytest
import redis
from redis.crc import key_slot

from queueing import services, store
from queueing.models import Queue
from queueing.store import TicketStatus, connection

from .factories import access_claims, access_token, join, status, status_reply, visitor


@pytest.fixture
def on_cluster(redis_cluster, settings):
    settings.REDIS_CLUSTER_NODES = redis_cluster.nodes
    yield redis_cluster
    client = store.client()
    keys = list(client.scan_iter(match=store.key_pattern(), count=1000))
    if keys:
        client.delete(*keys)


def node_client(port: int) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True, socket_timeout=5)


def slot_owners(port: int) -> dict[int, int]:
    """Slot -> the port of its master, as the node at `port` sees it."""
    owners = {}
    for start, end, master, *_ in node_client(port).execute_command("CLUSTER SLOTS"):
        owners.update(dict.fromkeys(range(int(start), int(end) + 1), int(master[1])))
    return owners


def slugs_on_every_master(cluster, per_master: int = 2) -> list[str]:
    owners = slot_owners(cluster.ports[0])
    chosen: dict[int, list[str]] = {}
    for n in itertools.count():
        slug = f"cq{n}"
        found = chosen.setdefault(owners[key_slot(f"{{{slug}}}".encode())], [])
        if len(found) < per_master:
            found.append(slug)
        if len(chosen) == 3 and all(len(s) == per_master for s in chosen.values()):
            return [slug for slugs in chosen.values() for slug in slugs]
    raise AssertionError("unreachable")


async def arank(slug: str, ticket_id: str, now: float) -> int:
    """A poll's place, asked from the event loop (the lanes), as the web server's hot path asks it."""
    parsed = store.parse_ticket_id(ticket_id)
    assert parsed is not None
    plan = store.status_plan(slug, visitor_key=parsed[1], seq=parsed[0], now_ms=int(now * 1000))
    reply = (await store.aexecute(plan))[0]
    assert reply.ticket is not None and reply.ticket.rank is not None
    return reply.ticket.rank


def rank(slug: str, ticket: store.TicketState, now: float) -> int:
    found = status_reply(slug, ticket, now=now).ticket
    assert found is not None and found.rank is not None
    return found.rank


def test_six_queues_on_all_three_masters_each_run_whole(on_cluster, make_queue, clock):
    slugs = slugs_on_every_master(on_cluster)
    queues = [make_queue(slug=slug, state="paused", capacity=2) for slug in slugs]
    for queue in queues:
        tickets = [join(queue.slug, f"{queue.slug}-{i}", now=clock()) for i in range(5)]
        assert [t.rank for t in tickets] == [0, 1, 2, 3, 4]
        services.queue_configure(slug=queue.slug, changes={"state": "open"}, actor_label="tests")
        reply = services.queue_admit(slug=queue.slug, now=clock.advance(1))
        assert reply is not None and len(reply.admitted) == 2
        assert status(queue.slug, tickets[0], now=clock()).status == TicketStatus.ADMITTED
        assert status(queue.slug, tickets[4], now=clock()).rank == 2
        assert store.snapshot(queue.slug).waiting == 3

    # Every key of a queue in one slot (the server's own CLUSTER KEYSLOT), and the queues on every master.
    owners = slot_owners(on_cluster.ports[0])
    masters = set()
    any_node = node_client(on_cluster.ports[0])
    for slug in slugs:
        pattern = f"{store.queue_keys(slug).cfg[: -len('cfg')]}*"
        keys = [key for port in on_cluster.master_ports() for key in node_client(port).keys(pattern)]
        assert len(keys) > 5
        slots = {any_node.execute_command("CLUSTER KEYSLOT", key) for key in keys}
        assert len(slots) == 1, (slug, slots)
        masters.add(owners[slots.pop()])
    assert masters == set(on_cluster.master_ports()) and len(masters) == 3


def _node_ids(cluster, slot: int) -> tuple[redis.Redis, redis.Redis, str, str]:
    owners = slot_owners(cluster.ports[0])
    source = owners[slot]
    target = next(port for port in cluster.master_ports() if port != source)
    src, dst = node_client(source), node_client(target)
    return src, dst, src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")


def _move_keys(src: redis.Redis, dst: redis.Redis, slot: int, src_id: str, dst_id: str) -> None:
    """A slot's move begun (CLUSTER SETSLOT IMPORTING, MIGRATING) and its keys moved (MIGRATE), as
    `redis-cli --cluster reshard` does it, without handing the slot over yet."""
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    target = dst.connection_pool.connection_kwargs["port"]
    while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)


def _hand_over(cluster, slot: int, dst_id: str) -> None:
    for port in cluster.master_ports():
        node_client(port).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


def test_the_event_loop_follows_a_slot_while_it_moves_and_after(on_cluster, make_queue, clock):
    queue = make_queue(slug="moving", state="paused")
    ticket = join(queue.slug, "mover", now=clock())
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    slot = key_slot(f"{{{queue.slug}}}".encode())
    src, dst, src_id, dst_id = _node_ids(on_cluster, slot)

    async def outcome() -> str:
        plan = store.status_plan(queue.slug, visitor_key=parsed[1], seq=parsed[0], now_ms=int(clock() * 1000))
        return (await store.aexecute(plan))[0].outcome

    def hand_over_soon() -> None:
        time.sleep(0.5)
        _hand_over(on_cluster, slot, dst_id)

    async def moving() -> list[str]:
        loop = asyncio.get_running_loop()
        seen = [await outcome()]  # the lanes read the map: the queue's master
        # Moving: its keys go, and a script (many keys) cannot run until the slot is handed over (TRYAGAIN,
        # after ASK). A poll meanwhile waits for the hand-over, which comes 0.5 s later, and then runs.
        await loop.run_in_executor(None, _move_keys, src, dst, slot, src_id, dst_id)
        handing = loop.run_in_executor(None, hand_over_soon)
        seen.append(await outcome())
        await handing
        seen.append(await outcome())  # the slot's new master (MOVED was followed; the map read again)
        await connection.aclose()
        return seen

    async def ranked() -> int:
        try:
            return await arank(queue.slug, ticket.ticket_id, clock())
        finally:
            await connection.aclose()

    # On its new master the queue's state is on another server than its epoch's (lua/_lib.lua
    # server_moved): its scripts answer no_config, from that node, until the next epoch begins there, as
    # the services do on that answer. Nothing was lost: the ticket keeps its place.
    assert asyncio.run(moving()) == ["ok", "no_config", "no_config"]
    assert slot_owners(on_cluster.ports[0])[slot] == dst.connection_pool.connection_kwargs["port"]
    services.queue_config_sync(Queue.objects.get(pk=queue.pk))
    assert asyncio.run(ranked()) == 0
    assert rank(queue.slug, ticket, clock()) == 0  # and redis-py's client, too
    assert store.snapshot(queue.slug).waiting == 1 and Queue.objects.get(pk=queue.pk).epoch == 2


def test_a_poll_while_a_slot_moves_for_too_long_fails_as_redis_errors_do(on_cluster, make_queue, clock):
    queue = make_queue(slug="stuck", state="paused")
    ticket = join(queue.slug, "mover", now=clock())
    parsed = store.parse_ticket_id(ticket.ticket_id)
    assert parsed is not None
    slot = key_slot(f"{{{queue.slug}}}".encode())
    src, dst, src_id, dst_id = _node_ids(on_cluster, slot)
    _move_keys(src, dst, slot, src_id, dst_id)

    async def poll() -> None:
        plan = store.status_plan(queue.slug, visitor_key=parsed[1], seq=parsed[0], now_ms=int(clock() * 1000))
        try:
            with pytest.raises(redis.RedisError):  # the API's 503, after about 2 s
                await asyncio.wait_for(store.aexecute(plan), 10)
        finally:
            await connection.aclose()

    started = time.monotonic()
    asyncio.run(poll())
    assert 1.5 < time.monotonic() - started < 5
    _hand_over(on_cluster, slot, dst_id)
    services.queue_config_sync(Queue.objects.get(pk=queue.pk))  # the next epoch, on the new master
    assert rank(queue.slug, ticket, clock()) == 0


def test_a_master_without_the_library_gets_it_loaded_on_the_first_call(on_cluster, make_queue, clock):
    queue = make_queue(state="paused")
    ticket = join(queue.slug, "a", now=clock())
    owner = slot_owners(on_cluster.ports[0])[key_slot(f"{{{queue.slug}}}".encode())]
    node_client(owner).function_flush()

    async def poll() -> int:
        try:
            return await arank(queue.slug, ticket.ticket_id, clock())
        finally:
            await connection.aclose()

    assert asyncio.run(poll()) == 0
    node_client(owner).function_flush()
    assert status(queue.slug, ticket, now=clock()).rank == 0


def test_turn_notices_on_every_master_are_told_from_their_queue_s_own_slot(
    on_cluster, make_queue, mailbox, clock, settings
):
    """The noticed set and the due list are the queue's keys (its hash tag): the scripts that fill them (a
    ticket admitted or ended names them from the queue's keys, lua/_transitions.lua) run on its master."""
    from queueing.models import TurnNotice

    from .factories import decode_ticket, ticket_token

    settings.WR_NOTIFY_NEAR_PLACES, settings.WR_NOTIFY_NEAR_SECONDS = 1, 0
    for slug in slugs_on_every_master(on_cluster, per_master=1):
        queue = make_queue(slug=slug, state="paused", capacity=1)
        first, second = join(slug, "first", now=clock()), join(slug, "second", now=clock())
        for ticket in (first, second):
            claims = decode_ticket(ticket_token(slug, ticket), slug=slug)
            services.turn_notice_request(claims=claims, email=f"{slug}@example.com", language="en", link="http://x/")
        services.queue_resume(queue)
        services.queue_admit(slug=slug, now=clock())  # the first admitted: due, told its turn
        store.revoke(slug, ticket_id=second.ticket_id, now_ms=int(clock() * 1000))  # the second ended: forgotten
    assert services.turn_notices_send(now=clock()) == 3
    assert sorted(message["Subject"].split(":")[1] for _, message in mailbox.messages) == [" it's your turn"] * 3
    assert TurnNotice.objects.count() == 0


def test_the_orphan_sweep_finds_queues_on_every_master(on_cluster, make_queue, clock):
    slugs = slugs_on_every_master(on_cluster, per_master=1)
    for slug in slugs:
        store.config_write(slug, {"state": "open", "synced_at": "0", "capacity": "1"})
    assert set(slugs) <= set(store.queue_slugs())
    dropped = services.queues_orphans_delete(now=clock())
    assert set(slugs) <= set(dropped)
    assert not set(slugs) & set(store.queue_slugs())
    assert visitor("x")  # the visitor keys' alphabet is what record_hashes names


def _raw(cluster: Any) -> redis.RedisCluster:
    """A cluster client that keeps replies as bytes (DUMP's are binary)."""
    return redis.RedisCluster.from_url(f"redis://{cluster.nodes.split(',')[0]}")


def _queue_keys_now(cluster: Any, slug: str) -> dict[str, bytes]:
    """Every key of the queue, DUMPed (its master's copy), to be put back as a failover would leave them."""
    raw = _raw(cluster)
    try:
        pattern = f"{store.queue_keys(slug).cfg[: -len('cfg')]}*"
        return {key.decode(): cast(bytes, raw.dump(key)) for key in raw.scan_iter(match=pattern, count=1000)}
    finally:
        raw.close()


def _as_before(cluster: Any, slug: str, before: dict[str, bytes]) -> None:
    """The queue's keys put back as they were: the writes since, lost (a promoted replica that lacked them)."""
    raw = _raw(cluster)
    try:
        for key in set(_queue_keys_now(cluster, slug)) - set(before):
            raw.delete(key)
        for key, dumped in before.items():
            raw.restore(key, 0, dumped, replace=True)
    finally:
        raw.close()


def test_a_completion_a_failover_lost_is_made_again_once_the_cluster_has_failed_over(
    on_cluster, make_queue, clock, settings, monkeypatch
):
    """Issue 51: after a failover that lost acknowledged writes, completions that had answered 204 were
    undone and their slots held for the whole session (900 s by default). Here the completion is lost as
    a failover loses it (the queue's keys put back as they were before it), and a real failover (CLUSTER
    FAILOVER on the master's replica) moves the cluster's epoch on: the web process's journal makes the
    completion again, the slot is freed and the next visitor admitted."""
    from queueing.services import completions, sessions

    settings.WR_FAILOVER_CHECK_SECONDS = 3600  # the journal's own thread stays asleep: checked here
    journal = completions.Journal(sessions._again)
    monkeypatch.setattr(sessions, "journal", journal)
    queue = make_queue(state="open", capacity=1)
    shopper = join(queue.slug, "shopper", now=clock())
    assert shopper.status == TicketStatus.ADMITTED
    nxt = join(queue.slug, "next", now=clock())
    assert nxt.status == TicketStatus.WAITING
    claims = access_claims(queue.slug, shopper)
    assert services.session_verify(slug=queue.slug, raw_token=access_token(queue.slug, shopper), now=clock()).valid

    before = _queue_keys_now(on_cluster, queue.slug)
    assert services.session_complete(slug=queue.slug, claims=claims, now=clock.advance(5)) == "completed"
    assert status(queue.slug, nxt, now=clock()).status == TicketStatus.ADMITTED
    assert journal.check(now=clock()) == 0  # the epoch as it was: nothing made again

    _as_before(on_cluster, queue.slug, before)  # what the failover loses
    assert status(queue.slug, shopper, now=clock()).status == TicketStatus.ACTIVE
    assert status(queue.slug, nxt, now=clock()).status == TicketStatus.WAITING  # the slot held again

    master = slot_owners(on_cluster.ports[0])[key_slot(f"{{{queue.slug}}}".encode())]
    replica = int(node_client(master).info("replication")["slave0"]["port"])
    epoch = store.cluster_epoch()
    node_client(replica).execute_command("CLUSTER FAILOVER")
    deadline = time.monotonic() + 30
    while replica not in on_cluster.master_ports() or not on_cluster.healthy():
        assert time.monotonic() < deadline, "the replica was not promoted"
        time.sleep(0.1)
    cast(
        Any, store.client()
    ).nodes_manager.initialize()  # (the product's client finds the new master on its first error)
    assert (store.cluster_epoch() or 0) > (epoch or 0)

    assert journal.check(now=clock.advance(1)) == 1  # made again, and it freed the slot
    assert journal.check(now=clock.advance(1)) == 0  # once
    assert status(queue.slug, shopper, now=clock()).status == TicketStatus.COMPLETED
    assert status(queue.slug, nxt, now=clock()).status == TicketStatus.ADMITTED


def test_completions_are_kept_for_a_replay_only_on_a_cluster_and_only_for_the_window(make_queue, clock, settings):
    from queueing.services import completions, sessions

    journal = completions.Journal(sessions._again)
    slug = make_queue(state="open", capacity=1).slug
    claims = access_claims(slug, join(slug, "a", now=clock()))
    settings.REDIS_CLUSTER_NODES = ""
    journal.note(slug, claims, now=clock())
    assert not journal._recent  # a single Redis has no failover
    settings.REDIS_CLUSTER_NODES = "127.0.0.1:1"  # (no node answers: the epoch is unknown, nothing replays)
    settings.WR_FAILOVER_CHECK_SECONDS = 3600
    settings.WR_COMPLETION_REPLAY_SECONDS = 60
    journal.note(slug, claims, now=clock())
    journal.note(slug, claims, now=clock.advance(61))
    assert len(journal._recent) == 1  # the first is older than the window
    settings.WR_COMPLETION_REPLAY_SECONDS = 0
    journal.note(slug, claims, now=clock())
    assert len(journal._recent) == 1
