"""Where ticket records live in Redis (issue 15): a waiting visitor's in one of the queue's small hashes
(`tk:<first two characters of the visitor key>`, kept by Redis as listpacks), every other record in the
queue's `tk` hash; one record per visitor, moved when it changes kind, and records written before the split
found and moved on their next save."""

from __future__ import annotations

import pytest

from queueing import store
from queueing.store import TicketStatus
from queueing.store.connection import raw_client

from .factories import join, status, visitor

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def where(slug: str, name: str) -> list[str]:
    keys, vk = store.queue_keys(slug), visitor(name)
    small, field = keys.record(vk)
    client = store.client()
    return [place for place, key, f in (("small", small, field), ("tk", keys.tk, vk)) if client.hexists(key, f)]


def test_a_waiting_record_is_in_a_small_hash_kept_as_a_listpack(make_queue, clock):
    queue = make_queue(state="paused")
    for name in ("ada", "bob", "cy"):
        join(queue.slug, name, now=clock())
    assert [where(queue.slug, name) for name in ("ada", "bob", "cy")] == [["small"]] * 3
    hashes = store.record_hashes(queue.slug)
    assert hashes and all(store.client().object("encoding", name) == "listpack" for name in hashes)
    assert {record.visitor_key for record in store.ticket_records(queue.slug)} == {
        visitor(name) for name in ("ada", "bob", "cy")
    }


def test_an_admitted_record_moves_to_tk_and_a_finished_one_stays_there(make_queue, clock):
    queue = make_queue(capacity=1)
    first = join(queue.slug, "first", now=clock())  # an open queue with a free slot: admitted at once
    second = join(queue.slug, "second", now=clock())
    assert first.status == TicketStatus.ADMITTED and second.status == TicketStatus.WAITING
    assert (where(queue.slug, "first"), where(queue.slug, "second")) == (["tk"], ["small"])
    parsed = store.parse_ticket_id(second.ticket_id)
    assert parsed is not None
    store.leave(queue.slug, visitor_key=parsed[1], seq=parsed[0], now_ms=int(clock.advance(1) * 1000))
    assert where(queue.slug, "second") == ["tk"]  # finished: out of the small hash
    assert status(queue.slug, second, now=clock()).status == TicketStatus.EXPIRED


def test_a_record_too_long_for_a_listpack_stays_in_tk_and_keeps_its_small_hash_a_listpack(make_queue, clock):
    queue = make_queue(state="paused")
    named = join(queue.slug, "named", now=clock(), display_name="Ω" * 40)  # 80 bytes of name
    assert where(queue.slug, "named") == ["tk"]
    assert status(queue.slug, named, now=clock.advance(1)).rank == 0  # a poll saves it: still in tk
    assert where(queue.slug, "named") == ["tk"]
    assert all(store.client().object("encoding", name) == "listpack" for name in store.record_hashes(queue.slug))


def test_a_record_written_before_the_split_is_found_and_moved_on_its_next_save(make_queue, clock):
    queue = make_queue(state="paused")
    ticket = join(queue.slug, "old", now=clock())
    keys, vk = store.queue_keys(queue.slug), visitor("old")
    small, field = keys.record(vk)
    client = raw_client()  # as an earlier version kept it: in tk, by visitor key
    client.hset(keys.tk, vk, client.hget(small, field))
    client.hdel(small, field)
    assert where(queue.slug, "old") == ["tk"]
    assert status(queue.slug, ticket, now=clock.advance(1)).rank == 0
    assert where(queue.slug, "old") == ["small"]  # one record, in its new place
