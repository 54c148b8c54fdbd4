"""The line kept in buckets (lua/_line.lua, line_add): small ZSETs Redis keeps as listpacks, a bucket index
and a count tree. Every place a visitor is told, every range and every admission must be what one sorted
set of everyone would give, across many buckets, with priority joiners, leavers and parked visitors."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import cast

import msgpack
import pytest

from queueing import services, shuffle, store
from queueing.models import QueueShuffle
from queueing.store import TicketStatus, connection

from .factories import join, status, visitor

pytestmark = pytest.mark.usefixtures("live_state")  # on a single Redis and on a Redis Cluster (conftest.live_state)


def _order(slug: str) -> list[str]:
    """Everyone in line, in the order one sorted set of (score, ticket id) would keep them."""
    _, pairs = store.line_read(slug)
    return [tid for tid, _ in sorted(pairs, key=lambda pair: (pair[1], pair[0]))]


def _rank(slug: str, ticket_id: str, now: float) -> int | None:
    """The place a poll of that ticket is told."""
    parsed = store.parse_ticket_id(ticket_id)
    assert parsed is not None
    reply = store.status(slug, visitor_key=parsed[1], seq=parsed[0], now_ms=int(now * 1000))
    assert reply.ticket is not None
    return reply.ticket.rank


def _check_layout(slug: str) -> None:
    """Each bucket a listpack within Redis's small-set limit, the index naming exactly the buckets that
    hold anyone, and the count tree's total right (and the tree a hashtable)."""
    client, keys = store.client(), store.queue_keys(slug)
    buckets = [key for key in store.line_keys(slug) if key not in (f"{keys.line}:i", f"{keys.line}:f")]
    sizes = {int(key.rsplit(":", 1)[1]): int(client.zcard(key)) for key in buckets}
    assert all(client.object("encoding", key) == "listpack" for key in buckets)
    assert all(0 < size <= 128 for size in sizes.values())
    indexed = sorted(int(b) for b in cast(list[str], client.zrange(f"{keys.line}:i", 0, -1)))
    assert indexed == sorted(sizes)
    assert store.line_count(slug) == sum(sizes.values())
    # The count tree stays a hashtable (a field longer than a listpack's values): as a listpack of hundreds
    # of fields, every field a poll reads would be a scan of them all.
    assert client.object("encoding", keys.line_tree) == "hashtable"


def _every_place_found(slug: str) -> None:
    """Each place read alone: found by halving the count tree (lua/_line.lua bucket_at) from the least power
    of two past the last bucket, not from the tree's whole reach."""
    line = store.line_members(slug)
    for place, tid in enumerate(line):
        assert store.line_members(slug, place, place) == [tid], place


def test_a_long_line_across_many_buckets_tells_everyone_their_true_place(make_queue, clock):
    queue = make_queue(state="paused")
    pick = random.Random(15)
    tickets = []
    for i in range(700):
        level = pick.choice([0] * 8 + [1, 2])  # one in five a priority joiner, placed inside the line
        tickets.append(join(queue.slug, f"v{i}", now=clock(), priority=level))
    gone = set(pick.sample(range(700), 150))
    for i in sorted(gone):
        ticket = tickets[i]
        store.leave(queue.slug, visitor_key=visitor(f"v{i}"), seq=ticket.seq, now_ms=int(clock() * 1000))

    line = store.line_members(queue.slug)
    assert line == _order(queue.slug)
    assert len(line) == 550 and store.snapshot(queue.slug).waiting == 550
    assert len(store.line_keys(queue.slug)) > 10  # many buckets, not one set
    _check_layout(queue.slug)
    for i, ticket in enumerate(tickets):
        if i not in gone:
            assert status(queue.slug, ticket, now=clock()).rank == line.index(ticket.ticket_id)
    # Any range, from any place (the count tree finds the bucket of a place deep in the line).
    for start in (0, 1, 63, 64, 65, 200, 401, 548, 549):
        assert store.line_members(queue.slug, start, start + 70) == line[start : start + 71]
    _every_place_found(queue.slug)
    # The neighbours of a visitor deep in the line.
    deep = next(t for i, t in enumerate(tickets) if i not in gone and line.index(t.ticket_id) > 400)
    name = f"v{tickets.index(deep)}"
    rank, rows = store.neighbours(
        queue.slug, visitor_key=visitor(name), seq=deep.seq, before=3, after=3, now_ms=int(clock() * 1000)
    )
    assert rank == line.index(deep.ticket_id)
    assert [row.rank for row in rows] == list(range(rank - 3, rank + 4))


def test_admission_walks_the_buckets_in_order_and_an_emptied_line_leaves_no_key(make_queue, clock):
    queue = make_queue(state="paused", capacity=1000, burst=40, outflow_per_minute=2400)
    for i in range(300):
        join(queue.slug, f"v{i}", now=clock(), priority=2 if i % 7 == 6 else 0)
    line = store.line_members(queue.slug)
    services.queue_resume(queue)
    first = services.queue_admit(slug=queue.slug, now=clock.advance(1))
    assert first is not None
    admitted = [a.ticket_id for a in first.admitted]
    assert admitted == line[: len(admitted)] and len(admitted) == 40
    while len(admitted) < 200:
        reply = services.queue_admit(slug=queue.slug, now=clock.advance(1))
        assert reply is not None and reply.admitted
        admitted += [a.ticket_id for a in reply.admitted]
    # The first bucket emptied and the next became the first, again and again: every place still right.
    left = store.line_members(queue.slug)
    assert left == line[len(admitted) :] == _order(queue.slug)
    for i, tid in enumerate(left):
        assert _rank(queue.slug, tid, clock()) == i
    # One of the last goes to the very front (a score before the first bucket's): it is the first bucket now.
    store.reorder(queue.slug, [(left[-1], 0.5)], now_ms=int(clock() * 1000))
    left = [left[-1], *left[:-1]]
    assert store.line_members(queue.slug) == left
    for i, tid in enumerate(left):
        assert _rank(queue.slug, tid, clock()) == i
    _check_layout(queue.slug)
    while store.line_count(queue.slug):
        reply = services.queue_admit(slug=queue.slug, now=clock.advance(1))
        assert reply is not None and reply.admitted
        admitted += [a.ticket_id for a in reply.admitted]
    assert admitted == line[:200] + left  # everyone, once, in line order
    assert store.line_keys(queue.slug) == []  # no empty bucket, index or count left behind


def test_a_parked_visitor_and_a_shuffled_pre_queue_keep_their_places_in_the_buckets(make_queue, clock):
    queue = make_queue(state="paused", capacity=1, burst=1, presence_timeout=30)
    early = [join(queue.slug, f"e{i}", now=clock() - 100) for i in range(3)]  # silent for 100 s
    rest = [join(queue.slug, f"r{i}", now=clock(), priority=1 if i % 5 == 4 else 0) for i in range(150)]
    services.queue_resume(queue)
    services.queue_admit(slug=queue.slug, now=clock.advance(1))  # the silent three are parked
    assert store.line_count(queue.slug) == 149 and len(store.away_members(queue.slug)) == 3
    back = status(queue.slug, early[1], now=clock())  # seen again: back at its place, at the head
    assert back.status == TicketStatus.WAITING and back.rank == 0
    assert store.line_members(queue.slug)[0] == early[1].ticket_id
    line = store.line_members(queue.slug)
    assert line == _order(queue.slug)
    for ticket in rest[1:]:
        assert status(queue.slug, ticket, now=clock()).rank == line.index(ticket.ticket_id)
    _check_layout(queue.slug)

    # The shuffle's new places (reorder.lua) move tickets between buckets, and their records keep them.
    places = {tid: float(1000 - i * 3) for i, tid in enumerate(line)}  # the line reversed, spread out
    moved, _ = store.reorder(queue.slug, list(places.items()), now_ms=int(clock() * 1000))
    assert moved == len(line)
    assert store.line_members(queue.slug) == list(reversed(line)) == _order(queue.slug)
    records = {r.ticket_id: r for r in store.ticket_records(queue.slug)}
    assert all(records[tid].line_score == score for tid, score in places.items())
    _check_layout(queue.slug)


def test_a_line_kept_in_one_set_before_the_buckets_moves_into_them_on_the_next_call(make_queue, clock):
    queue = make_queue(state="paused")
    tickets = [join(queue.slug, f"v{i}", now=clock(), priority=2 if i == 90 else 0) for i in range(100)]
    before = store.line_read(queue.slug)[1]
    # The state as the release before the buckets left it: one ZSET at `line`, a policy packed by an
    # earlier library (without the tag of today's layout: lua/_policy.lua), no line score in any record.
    client, keys = store.client(), store.queue_keys(queue.slug)
    client.delete(*store.line_keys(queue.slug))
    client.zadd(keys.line, dict(before))
    packed = json.loads(client.hget(keys.cfg, "packed"))  # type: ignore[arg-type]
    client.hset(keys.cfg, "packed", json.dumps(packed[1:]))
    client.hdel(keys.cfg, "line_layout")
    raw = connection.raw_client()
    where, field = keys.record(visitor("v90"))
    if not raw.hexists(where, field):
        where = keys.tk
    fields = msgpack.unpackb(cast(bytes, raw.hget(where, field)), raw=False)
    assert len(fields) == 14  # the priority joiner's record keeps its place: the old one did not
    raw.hset(where, field, msgpack.packb(fields[:7]))

    late = join(queue.slug, "late", now=clock())  # the policy is packed again, which moves the line
    assert client.exists(keys.line) == 0
    assert store.line_read(queue.slug)[1] == [*before, (late.ticket_id, float(late.seq))]
    assert late.rank == 100
    order = [tid for tid, _ in before]
    for ticket in tickets:
        assert status(queue.slug, ticket, now=clock()).rank == order.index(ticket.ticket_id)
    priority = next(r for r in store.ticket_records(queue.slug) if r.ticket_id == tickets[90].ticket_id)
    assert priority.line_score == dict(before)[tickets[90].ticket_id] != tickets[90].seq
    _check_layout(queue.slug)


def test_when_the_last_bucket_empties_the_one_before_it_becomes_the_last_and_places_stay_right(make_queue, clock):
    queue = make_queue(state="paused")
    tickets = [join(queue.slug, f"v{i}", now=clock()) for i in range(200)]
    keys = store.queue_keys(queue.slug)
    client = store.client()
    tail = int(cast(str, client.hget(keys.line_tree, "tail")))
    # Everyone from the middle of the second-to-last bucket on leaves, from the back.
    for ticket in reversed(tickets[150:]):
        store.leave(
            queue.slug, visitor_key=visitor(f"v{tickets.index(ticket)}"), seq=ticket.seq, now_ms=int(clock() * 1000)
        )
    assert int(cast(str, client.hget(keys.line_tree, "tail"))) < tail
    line = store.line_members(queue.slug)
    assert line == [t.ticket_id for t in tickets[:150]]
    for i, ticket in enumerate(tickets[:150]):
        assert status(queue.slug, ticket, now=clock()).rank == i
    later = [join(queue.slug, f"w{i}", now=clock()) for i in range(150)]  # new last buckets, one after another
    assert [t.rank for t in later] == list(range(150, 300))
    assert store.line_members(queue.slug) == line + [t.ticket_id for t in later]
    for i, ticket in enumerate(tickets[:150] + later):
        assert status(queue.slug, ticket, now=clock()).rank == i
    _check_layout(queue.slug)


def test_scores_below_the_first_bucket_or_beyond_the_trees_reach_share_the_end_buckets_in_order(make_queue, clock):
    queue = make_queue(state="paused")
    tickets = [join(queue.slug, f"v{i}", now=clock()) for i in range(100)]
    # Ten go far behind (beyond 2^16 buckets of the first), ten far ahead (below zero): the shuffle's
    # scores are free, and a parked visitor of long ago comes back with its own.
    places = [(t.ticket_id, (1e9 if i < 5 else 2e9) + 1000 - i) for i, t in enumerate(tickets[:10])]
    places += [(t.ticket_id, -5.0 - i) for i, t in enumerate(tickets[10:20])]
    store.reorder(queue.slug, places, now_ms=int(clock() * 1000))
    line = store.line_members(queue.slug)
    assert line == _order(queue.slug)
    assert line[:10] == [t.ticket_id for t in reversed(tickets[10:20])]
    assert line[-10:] == [t.ticket_id for t in [*reversed(tickets[:5]), *reversed(tickets[5:10])]]
    for ticket in tickets:
        assert status(queue.slug, ticket, now=clock()).rank == line.index(ticket.ticket_id)
    _every_place_found(queue.slug)
    latecomer = join(queue.slug, "late", now=clock())
    assert latecomer.rank == 90  # ahead of the far ones: in order of score, whatever bucket holds them
    assert store.line_members(queue.slug) == [*line[:90], latecomer.ticket_id, *line[90:]]
    assert all(
        status(queue.slug, t, now=clock()).rank == line.index(t.ticket_id) + (t.ticket_id in line[90:]) for t in tickets
    )


def test_a_score_from_below_the_first_bucket_moves_the_base_down_and_every_place_stays_right(make_queue, clock):
    queue = make_queue(state="paused")
    first = join(queue.slug, "first", now=clock())  # the live state exists: numbers from here on start at 20,000
    store.leave(queue.slug, visitor_key=visitor("first"), seq=first.seq, now_ms=int(clock() * 1000))
    store.client().hset(store.queue_keys(queue.slug).st, "seq", 20000)
    tickets = [join(queue.slug, f"v{i}", now=clock()) for i in range(200)]
    tree = store.queue_keys(queue.slug).line_tree
    base = int(cast(str, store.client().hget(tree, "base")))
    # Far behind (beyond the tree's reach from a low base), then one far ahead: the base cannot move down
    # yet, so the far-ahead one shares the first bucket.
    store.reorder(queue.slug, [(tickets[0].ticket_id, 1e9)], now_ms=int(clock() * 1000))
    store.reorder(queue.slug, [(tickets[1].ticket_id, 100.0)], now_ms=int(clock() * 1000))
    assert int(cast(str, store.client().hget(tree, "base"))) == base
    line = store.line_members(queue.slug)
    assert line == _order(queue.slug) and line[0] == tickets[1].ticket_id
    # The far-behind one comes back; then another goes ahead, into a bucket of its own below the base: the
    # base moves down, and the one kept in the first bucket goes to its own.
    store.reorder(queue.slug, [(tickets[0].ticket_id, 30000.0)], now_ms=int(clock() * 1000))
    store.reorder(queue.slug, [(tickets[2].ticket_id, 200.0)], now_ms=int(clock() * 1000))
    assert int(cast(str, store.client().hget(tree, "base"))) < base
    line = store.line_members(queue.slug)
    assert line[:2] == [tickets[1].ticket_id, tickets[2].ticket_id]
    assert line == _order(queue.slug)
    for tid in line:
        assert _rank(queue.slug, tid, clock()) == line.index(tid)
    _check_layout(queue.slug)
    _every_place_found(queue.slug)
    later = join(queue.slug, "later", now=clock())
    assert line[-1] == tickets[0].ticket_id  # at 30,000: behind the latecomer
    assert later.rank == len(line) - 1 and store.line_members(queue.slug) == [*line[:-1], later.ticket_id, line[-1]]


def test_the_shuffled_pre_queue_keeps_the_span_of_scores_it_had_so_its_buckets_stay_small(make_queue, clock):
    t0 = clock.now
    queue = make_queue(
        capacity=3,
        burst=10,
        presence_timeout=600,
        abandon_timeout=3600,
        prequeue_opens_at=datetime.fromtimestamp(t0 + 60, tz=UTC),
        starts_at=datetime.fromtimestamp(t0 + 120, tz=UTC),
    )
    store.client().hset(store.queue_keys(queue.slug).st, "seq", 20000)  # a later sale: numbers far from 0
    prequeue = [join(queue.slug, f"v{i}", now=t0 + 61) for i in range(300)]
    services.queue_tick(slug=queue.slug, now=t0 + 121)  # the shuffle, then the first admissions
    record = QueueShuffle.objects.get(queue=queue)
    places = shuffle.shuffled_places(record.order)
    assert sorted(places.values()) == sorted(float(t.seq) for t in prequeue)  # their own numbers, reordered
    line = store.line_read(queue.slug)[1]
    by_seq = {t.seq: t.ticket_id for t in prequeue}
    waiting = [by_seq[seq] for seq in record.order[3:]]
    assert [tid for tid, _ in line] == waiting  # in the shuffled order, behind the three admitted
    assert [score for _, score in line] == [places[seq] for seq in record.order[3:]]
    _check_layout(queue.slug)
