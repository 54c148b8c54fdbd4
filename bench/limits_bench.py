"""Rate limiter benchmark (issue 5): what each limiter costs per request, its throughput in Redis, and
how many joins one client address can force through each algorithm against the configured limit.

    .venv/bin/python bench/limits_bench.py [--requests 4000] [--redis-calls 100000]

1. Cost per request: status polls through Django's WSGI application (its fast path for polls, the same
   answer code the web server's event loop runs) in this process, first with no limiter, then with each
   algorithm on the `status` scope, interleaved over three rounds in the same run; the difference of the
   medians is the limiter's cost.
2. Throughput in Redis: each limiter script called pipelined (1,000 per round trip) on distinct keys,
   and its Redis-side time per call from INFO commandstats.
3. Forced-through joins: each algorithm configured for "60 joins a minute" (token bucket 60 + 1/s;
   leaking bucket 60 places, 1/s; fixed window 60 per 60 s; sliding log 60 per 60 s; sliding window
   counter 60 per 60 s), attacked by one address sending 20 requests a second for 10 simulated
   minutes, timed to hit window boundaries. Reported: joins let through per minute on average and in
   the worst 60 s.

Uses the machine's Redis (or an embedded one) under a prefix of its own, deleted afterwards.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from http_bench import _delete_prefix, machine  # noqa: E402

from waitingroom_site import devredis  # noqa: E402

SIXTY_A_MINUTE: dict[str, dict[str, Any]] = {
    "token_bucket": {"algorithm": "token_bucket", "capacity": 60, "refill_per_second": 1},
    "leaking_bucket": {"algorithm": "leaking_bucket", "size": 60, "outflow_per_second": 1},
    "fixed_window": {"algorithm": "fixed_window", "window_seconds": 60, "max_requests": 60},
    "sliding_log": {"algorithm": "sliding_log", "window_seconds": 60, "max_requests": 60},
    "sliding_window_counter": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 60},
}
# Generous limits for the cost measurement: nobody is refused, so every request does the same work.
NEVER_REFUSE: dict[str, dict[str, Any]] = {
    "token_bucket": {"algorithm": "token_bucket", "capacity": 1e9, "refill_per_second": 1e9},
    "leaking_bucket": {"algorithm": "leaking_bucket", "size": 10**9, "outflow_per_second": 1e9},
    "fixed_window": {"algorithm": "fixed_window", "window_seconds": 60, "max_requests": 10**9},
    "sliding_log": {"algorithm": "sliding_log", "window_seconds": 1, "max_requests": 10**6},
    "sliding_window_counter": {
        "algorithm": "sliding_window_counter",
        "fixed_window_seconds": 60,
        "max_requests": 10**9,
    },
}


def log(message: str) -> None:
    print(f"[limits_bench] {message}", file=sys.stderr, flush=True)


def setup(redis_url: str, prefix: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY=secrets.token_urlsafe(50),
        HTTPS="0",
        ALLOWED_HOSTS="testserver,127.0.0.1",
        DATABASE_URL=f"sqlite:///{OUT / 'limits-bench.sqlite3'}",
        REDIS_URL=redis_url,
        WR_REDIS_PREFIX=prefix,
        LOG_LEVEL="WARNING",
    )
    (OUT / "limits-bench.sqlite3").unlink(missing_ok=True)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def status_environ(slug: str, ticket: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": f"/api/v1/queues/{slug}/status",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_AUTHORIZATION": f"Bearer {ticket}",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def cost_per_request(requests: int) -> dict[str, Any]:
    from django.test import override_settings

    from queueing import services
    from waitingroom_site.wsgi import application

    slug = "limits-bench"
    services.queue_configure(
        slug=slug, changes={"name": slug, "target_url": "https://shop.example/", "state": "paused"}
    )
    tickets = []
    for i in range(200):
        result = services.queue_join(slug=slug, visitor_key=f"bench{i:05d}")
        from queueing import tokens

        ticket = result.ticket
        tokens_ = tokens.ticket_issue(slug=slug, ticket_id=ticket.ticket_id, seq=ticket.seq, priority=0, epoch=1)
        tickets.append(tokens_)

    def run(limits: dict[str, Any]) -> float:
        """Median µs per status request over `requests` polls."""
        with override_settings(WR_RATE_LIMITS=limits):
            timings = []
            for i in range(requests):
                environ = status_environ(slug, tickets[i % len(tickets)])
                t0 = time.perf_counter()
                body = b"".join(application(environ, lambda status, headers: None))  # type: ignore[arg-type]
                timings.append(time.perf_counter() - t0)
                if i == 0:
                    assert b'"position"' in body, body
            return statistics.median(timings) * 1e6

    variants = {"none": {}, **{name: {"status": config} for name, config in NEVER_REFUSE.items()}}
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    run({})  # warm up
    for _ in range(3):
        for name, limits in variants.items():
            rounds[name].append(run(limits))
    base = statistics.median(rounds["none"])
    return {
        name: {
            "median_us_per_request": round(statistics.median(values), 1),
            "rounds_us": [round(v, 1) for v in values],
            "limiter_cost_us": round(statistics.median(values) - base, 1) if name != "none" else 0.0,
        }
        for name, values in rounds.items()
    }


def redis_throughput(calls: int) -> dict[str, Any]:
    from queueing import ratelimit, store

    client = store.client()
    results = {}
    for name, config in NEVER_REFUSE.items():
        limiter = ratelimit.limiter_from_config(config)
        function = store.library().function(f"limits/{name}")
        store.load_library(client)
        before = client.info("commandstats").get("cmdstat_fcall", {})  # deltas: never reset a shared server
        now_ms = int(time.time() * 1000)
        t0 = time.perf_counter()
        for start in range(0, calls, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(calls, start + 1000)):
                key = store.limit_key(f"bench-{name}", f"k{i % 10000}")
                pipe.fcall(function, 1, key, *limiter.arguments(now_ms + i // 100))
            pipe.execute()
        wall = time.perf_counter() - t0
        after = client.info("commandstats").get("cmdstat_fcall", {})
        count = int(after.get("calls", 0)) - int(before.get("calls", 0))
        usec = float(after.get("usec", 0)) - float(before.get("usec", 0))
        results[name] = {
            "calls_per_second_pipelined": round(calls / wall),
            "redis_us_per_call": round(usec / count, 2) if count else None,
        }
    return results


def _worst_60_seconds(passed: list[float]) -> int:
    worst, j = 0, 0
    for i, t in enumerate(passed):
        while passed[j] <= t - 60:
            j += 1
        worst = max(worst, i - j + 1)
    return worst


def forced_through() -> dict[str, Any]:
    """Two attackers per algorithm, 10 simulated minutes each: a steady 20 requests a second, and one
    who sends 100 requests in the last half second of every minute and 100 in the first half second
    of the next (the fixed window's weak spot)."""
    from queueing import ratelimit, store

    start = (int(time.time()) // 60 + 1) * 60  # a minute boundary
    duration = 600
    steady = [start + i / 20 for i in range(duration * 20)]
    boundary = [start + m * 60 + offset + k / 200 for m in range(1, 10) for offset in (-0.5, 0) for k in range(100)]
    results: dict[str, Any] = {}
    for name, config in SIXTY_A_MINUTE.items():
        limiter = ratelimit.limiter_from_config(config)
        figures: dict[str, Any] = {"configured_per_minute": 60}
        for attack, times in (("steady_20_per_second", steady), ("bursts_at_window_edges", boundary)):
            key = store.limit_key("bench-attack", uuid.uuid4().hex)
            passed = [t for t in times if limiter.hit(key, now=t).allowed]
            figures[attack] = {
                "offered": len(times),
                "passed_per_minute": round(len(passed) / (duration / 60), 1),
                "worst_60_seconds": _worst_60_seconds(passed),
            }
        results[name] = figures
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--redis-calls", type=int, default=100_000)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    redis_url = devredis.resolve()
    embedded = None
    if redis_url is None:
        embedded, redis_url = devredis.start_embedded(OUT / "limits-redis", daemonize=False)
    prefix = f"wrlim{uuid.uuid4().hex[:6]}"
    results: dict[str, Any] = {"machine": machine(), "command": " ".join(["bench/limits_bench.py", *sys.argv[1:]])}
    try:
        setup(redis_url, prefix)
        log("cost per status request")
        results["cost_per_request"] = cost_per_request(args.requests)
        log("throughput in Redis")
        results["redis"] = redis_throughput(args.redis_calls)
        log("joins forced through by one address")
        results["forced_through"] = forced_through()
    finally:
        _delete_prefix(redis_url, prefix)
        if embedded is not None:
            embedded.terminate()
    (OUT / "limits_bench.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
