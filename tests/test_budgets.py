"""The hot path's budget, held deterministically (issue 49): the Redis commands a status poll, a join and the
admission tick run, counted on a server of the test's own (INFO commandstats, the scripts' own commands
included). A change that adds work to them says so here, in its own run, whatever the machine. (A
completion's is test_engine_sessions'.)"""

from __future__ import annotations

from typing import Any

from queueing import modes, services, store, tokens

from .factories import join, ticket_claims
from .test_engine_sessions import commands_of


def counted(call: Any) -> dict[str, int]:
    client = store.client()
    client.config_resetstat()
    call()
    return commands_of(client)


def crowd(slug: str, count: int, clock: Any) -> list[tokens.TicketClaims]:
    return [ticket_claims(slug, join(slug, f"budget-{i}", now=clock())) for i in range(count)]


def test_a_status_poll_with_its_limiter_is_one_script_within_its_budget(redis_of_its_own, make_queue, clock, settings):
    from waitingroom_site import settings as product

    settings.WR_RATE_LIMITS = {"status": product.WR_RATE_LIMITS["status"]}  # the product's default limiter
    queue = make_queue(state="paused", capacity=2)
    claims = crowd(queue.slug, 30, clock)
    modes.status(claims[20], limit_scope="status", now=clock.advance(1))  # the mode, as a process remembers it
    paused = counted(lambda: modes.status(claims[20], limit_scope="status", now=clock.advance(1)))
    # One round trip, one script (the token bucket is status.lua's own, kept in the ticket's record): 9
    # commands, measured on 2026-12-05.
    assert paused["fcall"] == 1 and sum(paused.values()) <= 9, paused
    services.queue_resume(queue)
    services.queues_tick(instance="budget", now=clock.advance(1))  # both slots taken: the rest wait
    opened = counted(lambda: modes.status(claims[20], limit_scope="status", now=clock.advance(1)))
    # Open, with a wait to estimate, read off the leader's table of waits (lua/_estimates.lua waits_read):
    # the same 9 commands, and the queue's counters read once, only those the figures and the table need.
    assert opened["fcall"] == 1 and sum(opened.values()) <= 9, opened
    assert opened["hmget"] == paused["hmget"], (opened, paused)
    # Without the table the poll works its wait out: then, and only then, it reads the model's inputs too.
    store.client().hdel(store.queue_keys(queue.slug).st, "wt")
    worked_out = counted(lambda: modes.status(claims[20], limit_scope="status", now=clock.advance(0.1)))
    assert worked_out["hmget"] == opened["hmget"] + 1 and sum(worked_out.values()) <= 10, worked_out


def test_a_join_is_one_script_within_its_budget(redis_of_its_own, make_queue, clock):
    queue = make_queue(state="paused")
    crowd(queue.slug, 10, clock)
    key = tokens.visitor_key("budget-new")
    ran = counted(lambda: services.queue_join(slug=queue.slug, visitor_key=key, now=clock.advance(1)))
    assert ran["fcall"] == 1 and sum(ran.values()) <= 17, ran  # 17 measured on 2026-12-05
    # The queue's counters read by name (HMGET): those the figures, the model and the placing read. HGETALL
    # read every one, twice a join, the ticks' texts too (in a sale some 36 fields and 1 KB).
    assert "hgetall" not in ran and ran["hmget"] >= 2, ran


def test_a_tick_runs_its_budget_of_redis_commands_and_next_to_none_for_a_queue_nobody_is_in(
    redis_of_its_own, make_queue, clock
):
    """Every tick re-mirrored every queue's policy (config.lua: the policy written, packed and read back)
    whether or not anything had changed, and ran the lease and an admission round for queues nobody was in.
    Now the policy is written only when it differs from what Redis holds (a digest of it; a changed one is
    mirrored by the next tick as before: test_tasks), and a queue nobody is in is noted idle once
    (lua/idle.lua) and then costs its tick one read."""
    queue = make_queue(capacity=10)  # (its policy mirrored as it is saved)
    noted = counted(lambda: services.queues_tick(instance="counting", now=clock.advance(1)))
    # The first read (digest, live state, whether anyone is in it: 6 commands), then the idle note (a script):
    # 20 commands, measured on 2026-12-05.
    assert noted["fcall"] == 1 and sum(noted.values()) <= 20, noted
    alone = counted(lambda: services.queues_tick(instance="counting", now=clock.advance(1)))
    # One round trip, no script: 2 scripts (the lease, the admission round) and 23 commands a tick before.
    assert "fcall" not in alone and sum(alone.values()) <= 6, alone
    assert store.client().get(store.queue_keys(queue.slug).leader) is None  # no lease kept for nobody
    join(queue.slug, "waiting", now=clock())
    someone = counted(lambda: services.queues_tick(instance="counting", now=clock.advance(1)))
    # The lease (taken now) and the admission round with someone in the queue: 2 scripts.
    assert someone["fcall"] == 2 and sum(someone.values()) <= 32, someone  # 32 measured on 2026-12-05
    assert store.client().get(store.queue_keys(queue.slug).leader)
    assert not store.config_held(queue.slug).idle  # the round took it that somebody came


def test_a_queue_nobody_is_in_is_not_left_alone_while_it_ends_on_a_schedule_or_follows_the_site_s_health(
    redis_of_its_own, make_queue, clock
):
    """Its end is the lease holder's to do, and an adaptive outflow follows the site's health whoever is in
    line: such a queue's round runs every tick (fails when lua/idle.lua's note leaves them alone)."""
    from datetime import UTC, datetime, timedelta

    ending = make_queue(capacity=5, ends_at=datetime.fromtimestamp(clock.now, UTC) + timedelta(hours=1))
    adaptive = make_queue(
        capacity=5, adaptive_outflow=True, outflow_per_minute=60, outflow_min_per_minute=10, outflow_max_per_minute=600
    )
    for _ in range(3):
        services.queues_tick(instance="counting", now=clock.advance(1))
    for queue in (ending, adaptive):
        assert not store.config_held(queue.slug).idle
        assert store.client().get(store.queue_keys(queue.slug).leader)  # its lease kept: its round ran


def test_the_leader_s_table_of_waits_grows_with_the_log_of_the_line_not_with_the_line(
    redis_of_its_own, make_queue, clock
):
    """The leader's tick works out the waits polls read (lua/_estimates.lua waits_tabulate): at places
    0, 1, 2, 4, ... and at most 24 middles more. A line ten times longer costs it a few places more."""
    counts, places = [], []
    for size in (100, 1000):
        queue = make_queue(capacity=5, outflow_per_minute=60, burst=1)
        crowd(queue.slug, size, clock)
        services.queues_tick(instance="counting", now=clock.advance(1))
        ran = counted(lambda slug=queue.slug: services.queue_tick(slug=slug, instance="counting", now=clock.advance(1)))
        counts.append(sum(ran.values()))
        table = str(store.client().hget(store.queue_keys(queue.slug).st, "wt")).split()
        places.append(len(table[1:]) // 2)
    assert places[0] <= 8 + 24 and places[1] <= 11 + 24 and places[1] - places[0] <= 6, places
    # The tick's commands, measured on 2026-12-05: 209 and 508 (1,120 when finding a place deep in the line
    # read 17 fields of its count tree one by one, where halving from past the last bucket reads 5 here).
    assert counts[0] <= 215 and counts[1] <= 520, counts
