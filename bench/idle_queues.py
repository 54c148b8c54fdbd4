"""What the admission tick costs a worker and Redis each second when most queues are idle (issue 49): many
configured queues nobody is in, a few with crowds, on a dedicated redis-server this script starts and a
SQLite database of its own.

    .venv/bin/python bench/idle_queues.py [--idle 990] [--crowded 10] [--waiting 500] [--ticks 10]

One tick is `services.queues_tick`, what the beat's "Admission tick" task runs each second on a worker. Per
tick it prints the worker's CPU (ms), Redis's own time (µs, INFO commandstats, scripts included), Redis
commands and SQL queries, for the tick as it is (the policy mirrored only when Redis does not hold it) and,
in the same run for comparison, with every queue's admission round run (none nobody is in left alone, as
before they were: lua/idle.lua) and with the policy mirrored into Redis every tick as before issue 49.
The beat's own cost is one task sent a second, whatever the number of queues: not measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from http_bench import own_redis_and_database  # noqa: E402  (it puts the project root on sys.path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=int, default=990, help="open queues nobody is in")
    parser.add_argument("--crowded", type=int, default=10, help="open queues with visitors waiting, every slot taken")
    parser.add_argument("--waiting", type=int, default=500, help="visitors waiting in each crowded queue")
    parser.add_argument("--ticks", type=int, default=10, help="ticks measured per way (after one to warm up)")
    args = parser.parse_args()
    with own_redis_and_database("wrbench-idle-"):
        print(json.dumps(measure(args.idle, args.crowded, args.waiting, args.ticks), indent=2))


def measure(idle: int, crowded: int, waiting: int, ticks: int) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queueing import services, store, tokens
    from queueing.services import admission

    call_command("migrate", verbosity=0)
    base = {"target_url": "https://shop.example/", "capacity": 5, "outflow_per_minute": 600, "burst": 10}
    for i in range(idle):
        services.queue_configure(slug=f"idle-{i}", changes={**base, "name": f"idle {i}"}, actor_label="bench")
    for i in range(crowded):
        slug = f"crowd-{i}"
        services.queue_configure(slug=slug, changes={**base, "name": f"crowd {i}"}, actor_label="bench")
        for v in range(waiting):
            services.queue_join(slug=slug, visitor_key=tokens.visitor_key(f"{slug}:{v}"))
    client = store.client()
    clock = [time.time()]

    def tick() -> tuple[float, float, int, int]:
        clock[0] += 1
        client.config_resetstat()
        with CaptureQueriesContext(connection) as queries:
            cpu = time.process_time()
            services.queues_tick(instance="bench", now=clock[0])
            cpu = time.process_time() - cpu
        stats = {k: v for k, v in client.info("commandstats").items() if k not in ("cmdstat_config|resetstat",)}
        usec = sum(float(row["usec"]) for row in stats.values())
        calls = sum(int(row["calls"]) for row in stats.values())
        return cpu * 1000, usec, calls, len(queries)

    always = getattr(admission, "queue_config_sync")  # noqa: B009  (what the tick calls, swapped below)

    def every_tick(queue: Any, *, now: float | None = None, unless_held: bool = False, held: Any = None) -> None:
        always(queue, now=now)

    results: dict[str, list[tuple[float, float, int, int]]] = {
        "as now": [],
        "every queue's round (none left alone)": [],
        "mirrored every tick": [],
    }
    nothing_due = getattr(admission, "_nothing_due")  # noqa: B009  (swapped below: no queue left alone)
    tick()  # the first tick takes every lease and sets up what a first tick sets up
    for _ in range(ticks):  # the two ways alternate, so a machine's drift weighs on both alike
        # (a tick of the old way runs every queue's round, after which the next notes the idle ones again:
        # lua/idle.lua, once per idle spell, not measured as a tick of the steady state)
        tick()
        results["as now"].append(tick())
        setattr(admission, "_nothing_due", lambda queue: False)  # noqa: B010
        try:
            results["every queue's round (none left alone)"].append(tick())
        finally:
            setattr(admission, "_nothing_due", nothing_due)  # noqa: B010
        setattr(admission, "queue_config_sync", every_tick)  # noqa: B010
        try:
            results["mirrored every tick"].append(tick())
        finally:
            setattr(admission, "queue_config_sync", always)  # noqa: B010
    queues = idle + crowded
    out: dict[str, Any] = {"queues": queues, "idle": idle, "crowded": crowded, "waiting_each": waiting}
    for way, rows in results.items():
        cpu, usec, calls, sql = (sorted(column)[len(column) // 2] for column in zip(*rows, strict=True))
        out[way] = {
            "worker_cpu_ms_per_tick": round(cpu, 1),
            "worker_cpu_us_per_queue": round(cpu * 1000 / queues, 1),
            "redis_us_per_tick": round(usec),
            "redis_us_per_queue": round(usec / queues, 1),
            "redis_commands_per_queue": round(calls / queues, 1),
            "sql_queries_per_tick": sql,
        }
    return out


if __name__ == "__main__":
    main()
