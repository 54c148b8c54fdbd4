"""Redis time per call of the hot path's scripts (issue 14), on a dedicated redis-server this script starts:
INFO commandstats' `usec` for FCALL over N calls, pipelined 500 per round trip, with a queue of
--tickets waiting visitors polling in rotation and the default status limiter.

    .venv/bin/python bench/script_cost.py [--tickets 1000] [--calls 5000] [--rounds 3]

Prints µs per call for: the status poll with its limiter (one script: what a poll runs), the status
script alone, the token-bucket limiter alone, a join (a new visitor each call), the window read, and the
status script on the queue opened, its estimate with and without walk-aways and priority joiners to
weigh, and with every slot taken and 36 admissions nobody has claimed (slots_back); and the leader's
tick on those slots (its look at the slots held: the curve of slots back).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from http_bench import own_redis_and_database  # noqa: E402  (it puts the project root on sys.path)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--tickets", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3, help="the lowest round's figure is printed")
    args = parser.parse_args()
    with own_redis_and_database("wrbench-scripts-", debug=True):
        print(json.dumps(measure(args.tickets, args.calls, args.rounds), indent=2))


def measure(tickets: int, calls: int, rounds: int = 3) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command

    from queueing import ratelimit, selectors, services, store, tokens
    from queueing.store.connection import combined

    call_command("migrate", verbosity=0)
    changes = {"name": "bench", "target_url": "https://shop.example/", "capacity": 1, "state": "paused"}
    services.queue_configure(slug="bench", changes=changes, actor_label="bench")
    client = store.client()
    claims: list[tokens.TicketClaims] = []
    for i in range(tickets):
        joined = services.queue_join(slug="bench", visitor_key=tokens.visitor_key(f"bench:{i}"))
        raw = tokens.ticket_issue(
            slug="bench", ticket_id=joined.ticket.ticket_id, seq=joined.ticket.seq, priority=0, epoch=1
        )
        claims.append(cast(tokens.TicketClaims, tokens.visitor_ticket_decode(raw, slug="bench")))

    def per_call(name: str, call: Any, before: Any = None) -> float:
        """The lowest of `rounds` rounds of `calls` calls (the timer's noise only ever adds); `before(pipe)`
        adds commands of its own ahead of each call (not counted: only FCALL's time is)."""
        function = store.library().function(name)
        store.load_library(client)
        figures = []
        for _ in range(rounds):
            client.config_resetstat()
            pipe = client.pipeline(transaction=False)
            for i in range(calls):
                _, keys, argv = call(i)
                if before is not None:
                    before(pipe)
                pipe.fcall(function, len(keys), *keys, *argv)
                if i % 500 == 499:
                    pipe.execute()
            pipe.execute()
            stats = client.info("commandstats")["cmdstat_fcall"]
            assert stats["calls"] == calls and not stats.get("failed_calls"), stats
            figures.append(float(stats["usec"]) / calls)
        return round(min(figures), 2)

    start, clock = time.time(), iter(range(10**9))

    def poll(scope: str) -> Any:
        # Honest pollers: the clock moves 2 ms a call, so each ticket comes back 2 s later (with 1,000
        # tickets) and its limiter lets it through, as in production; a refused poll would cost less.
        def plan(i: int) -> Any:
            now = start + next(clock) * 0.002
            return combined(selectors.ticket_status_plan(claims=claims[i % tickets], now=now, limit_scope=scope).calls)

        return plan

    def limit_call(ident: str) -> Any:
        found = ratelimit.prepare("status", ident, queue="bench")
        assert found is not None
        return found.call

    with_limit = poll("status")(0)[0]

    def join_call(i: int) -> Any:
        # Each from an address of its own (the join limit is per address): every join goes through.
        limit = ratelimit.prepare("join", f"198.51.{i // 256 % 256}.{i % 256}")
        visitor = tokens.visitor_key(f"join:{uuid.uuid4()}")
        return services.join_plan(slug="bench", visitor_key=visitor, limit=limit)

    join_with_limit = join_call(0).call[0]
    limiter = ratelimit.scope_limiter("status")
    assert limiter is not None
    keys = store.queue_keys("bench")
    results = {
        "redis_version": client.info("server")["redis_version"],
        "waiting": store.line_count("bench"),
        f"status with its limiter ({with_limit})": per_call(with_limit, poll("status")),
        "status alone": per_call("status", poll("")),
        f"limiter alone (limits/{limiter.algorithm})": per_call(
            f"limits/{limiter.algorithm}",
            lambda i: limit_call(claims[i % tickets].visitor_key),
        ),
        "join (a new visitor each call)": per_call(
            "join",
            lambda i: (
                "join",
                [*keys.script_keys(), keys.tagged("addr:"), keys.tagged("pow:")],
                (tokens.visitor_key(f"join:{uuid.uuid4()}"), int(time.time() * 1000), 0, "", 0, 0, 0),
            ),
        ),
        f"join with its limiter, as the event loop runs it ({join_with_limit})": per_call(
            join_with_limit, lambda i: join_call(i).call
        ),
        "window read (window/read)": per_call("window/read", lambda i: store.window_read_plan("bench").calls[0]),
    }
    # The queue above is paused, so a poll gives no estimate. Open, with walk-aways learnt (a rate per band
    # of time waited), the head a minute ahead and priority joiners coming, a poll's estimate solves for its
    # wait (lua/_estimates.lua estimate_wait).
    services.queue_configure(slug="bench", changes={"state": "open"}, actor_label="bench")
    now_ms = int(time.time() * 1000)
    # walking away by time waited (a rate per band, lua/_walkaways.lua HAZARD_BANDS); the head's join
    learnt = ("0.05 0.02 0.01 0.005 0.002 0.002 0.002 0.002", now_ms - 60_000)
    # the tick's look at the line, as silent_look writes it: 12 places of the 48 it looked at, each with its
    # wait, the tickets looked at up to it and how many of those were found silent (one in five)
    look = [now_ms, tickets]
    for k in range(12):
        look += [k * tickets // 12, 60 - k * 5, 4 * (k + 1), (4 * (k + 1)) // 5]
    client.hset(
        keys.st,
        mapping={
            "thetas": learnt[0],
            "head_js": learnt[1],
            "silent": "0.1",
            "pri": f"0.05 0.1 0 {now_ms} 0.04 0.08 0 {now_ms - 120_000}",
            "lj": json.dumps(look),
        },
    )
    results["status alone, open: an estimate with walk-aways and priority joiners"] = per_call("status", poll(""))
    client.hdel(keys.st, "thetas", "pri", "lj")
    results["status alone, open: an estimate with neither"] = per_call("status", poll(""))
    # Every slot taken, 36 of them by admissions nobody has claimed for over 10 s (their deadlines over the
    # next 5 s), the rest by sessions: a poll looks at the first 32 late ones one by one (slots_back) against
    # the tick's curve of the other slots back, at every step of its bisection (walk-aways to weigh).
    capacity, late = 60, 36
    now_ms = int(time.time() * 1000)  # and every poll at this moment: the deadlines stay ahead, the claims late
    ttl = {"claim_ttl": 15, "session_ttl": 600}
    services.queue_configure(slug="bench", changes={"capacity": capacity, **ttl}, actor_label="bench")
    client.zadd(keys.claims, {f"late-{k}": now_ms + (k * 5000) // late for k in range(late)})  # claimed by 15 s
    client.zadd(keys.sessions, {f"held-{k}": now_ms + 600_000 - 1000 * (k % 20) for k in range(capacity - late)})
    step = 2 * 20 / 24  # RETURN_HOLDS mean holds of 20 s over RETURN_POINTS steps
    curve = " ".join(f"{capacity * (1 - 0.9 ** (k + 1)):.4g}" for k in range(24))
    client.hset(
        keys.st,
        mapping={
            "thetas": learnt[0],
            "lj": json.dumps([now_ms, *look[1:]]),
            "head_js": now_ms - 60_000,
            "ema_service_ms": "20000",
            "svm": "20000",
            "svr": f"{now_ms} {step:.4g} {curve}",
        },
    )

    def poll_now(i: int) -> Any:
        return combined(
            selectors.ticket_status_plan(claims=claims[i % tickets], now=now_ms / 1000, limit_scope="").calls
        )

    results["status alone, every slot taken, 36 admissions unclaimed: the late ones one by one"] = per_call(
        "status", poll_now
    )
    # The same queue after the leader's tick, as it runs once a second: its looks at the line and at the slots
    # held (from the queue's own tickets and slots now, not the figures written above), and the table of
    # waits that polls read (lua/_estimates.lua waits_tabulate); then the same polls without the table.
    client.set(keys.leader, "bench-leader")

    def tick(i: int) -> Any:  # (a model every 4 s: WR_MODEL_SECONDS=4; by default every call makes it)
        return ("admit", keys.script_keys(), (now_ms, "bench-leader", 100, 100, 4000))

    def model_due(pipe: Any) -> None:  # the model's last look and table forgotten: every call makes them
        pipe.hdel(keys.st, "lj", "wtm")

    def look_due(pipe: Any) -> None:  # the look forgotten, the table kept: every call carries it (nothing moved)
        pipe.hdel(keys.st, "lj")

    # The model (the looks and the table) is made at every tick by default; with WR_MODEL_SECONDS=4 every 4 s
    # (lua/_estimates.lua model_tick): the ticks between admit, and leave it (the same moment: each call finds
    # the model just made).
    model = per_call("admit", tick, before=model_due)
    carried = per_call("admit", tick, before=look_due)
    between = per_call("admit", tick)
    results["the leader's tick (admit), open, every slot taken: its looks and its table of waits"] = model
    results["the leader's tick (admit), open, every slot taken: its looks, the table carried"] = carried
    results["the leader's tick (admit), open, every slot taken: between two models (WR_MODEL_SECONDS=4)"] = between
    results["the leader's tick (admit), open, every slot taken: a second's share at WR_MODEL_SECONDS=4"] = (
        round((model + 3 * between) / 4, 2)
    )
    results["the leader's tick (admit), open, every slot taken: a second's share at 4 s, the table carried"] = (
        round((carried + 3 * between) / 4, 2)
    )
    results["status alone, after the tick: the wait read from its table"] = per_call("status", poll_now)
    # A join into that line (the counters as a sale leaves them: the looks' and the table's texts); its wait
    # is worked out (a join's always is), at the back of a line that grows by each call.
    in_line = store.line_count("bench")
    results["join, open, every slot taken, after the tick: a sale's counters"] = per_call(
        "join",
        lambda i: (
            "join",
            [*keys.script_keys(), keys.tagged("addr:"), keys.tagged("pow:")],
            (tokens.visitor_key(f"join:{uuid.uuid4()}"), now_ms, 0, "", 0, 0, 0),
        ),
    )
    assert store.line_count("bench") == in_line + calls * rounds  # each one joined (not 'no_seq', not 'full')
    client.hdel(keys.st, "wt")
    results["status alone, after the tick: the wait worked out (no table)"] = per_call("status", poll_now)
    # The leader's tick, once a second per queue, on the same slots: it looks at 24 of the slots held (each
    # one's record too, to know whether it was let in at its join), adds their seconds per band of time
    # held, works out the life table and draws the curve of slots back (lua/_holds.lua returns_look),
    # and looks at the line. Paused, so that it admits nobody and every call does the same work; the
    # record of holds is written in the 14 bands of before, which a version of 28 reads into its own at
    # the first call (and saves so).
    services.queue_configure(slug="bench", changes={"state": "paused"}, actor_label="bench")
    client.hset(
        keys.st,
        mapping={
            "svh": "0 0 3 4 3 0 0 0 0 0 0 0 0 0",
            "svx": f"{now_ms} 50 50 50 35 8 0 0 0 0 0 0 0 0 0",
            "cwl": "1000 10",
            "cwj": "10 10",
        },
    )
    model = per_call("admit", tick, before=model_due)
    between = per_call("admit", tick)
    results["the leader's tick (admit), paused, every slot taken: its look at the slots held"] = model
    results["the leader's tick (admit), paused, every slot taken: between two looks (WR_MODEL_SECONDS=4)"] = between
    results["the leader's tick (admit), paused, every slot taken: a second's share at WR_MODEL_SECONDS=4"] = round(
        (model + 3 * between) / 4, 2
    )
    return results


if __name__ == "__main__":
    main()
