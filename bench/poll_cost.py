"""What a status poll costs in Python, in-process: `status_answer` (the ticket check, the status script with
its limiter in one Redis round trip, the answer) called in a loop, without any HTTP server. For comparing
two versions of the code on one machine in one sitting (HTTP throughput is too noisy for that):

    .venv/bin/python bench/poll_cost.py [--tree PATH_TO_ANOTHER_CHECKOUT] [--polls 4000] [--runs 7] [--loop]
        [--profile N]

`--loop`: the web server's path instead, the ASGI application (waitingroom_site.web:application) called on
an event loop with an HTTP scope, one poll after another (what granian hands it, without the sockets).
`--join`: joins instead of polls, on the event loop (a new visitor each, the line growing by --polls a run).
`--profile N`: cProfile's N most costly functions (by their own time) over one more run.

Uses REDIS_URL (default 127.0.0.1:6379) database 14 under a key prefix of its own, deleted at the end, and
a SQLite file under /tmp. Prints microseconds per poll for each run and their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--polls", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--join", action="store_true")
    parser.add_argument("--profile", type=int, default=0)
    args = parser.parse_args()
    tree = str(Path(args.tree).resolve())
    sys.path.insert(0, tree)
    os.chdir(tree)
    prefix = f"pollcost{uuid.uuid4().hex[:6]}"
    os.environ.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        DEBUG="1",
        HTTPS="0",
        ALLOWED_HOSTS="testserver",
        DATABASE_URL=f"sqlite:////tmp/{prefix}.sqlite3",
        REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"),
        WR_REDIS_PREFIX=prefix,
        # (the 200 joins below come from one address: the join limit lifted)
        WR_RATE_LIMITS='{"status": {"algorithm": "token_bucket", "capacity": 1e12, "refill_per_second": 1e9}, '
        '"join": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 1000000000}}',
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client

    from queueing import services, store

    try:
        from queueing.api.answers import status_answer
    except ImportError:  # before the hot path had a module of its own
        from queueing.api.views import status_answer  # type: ignore[attr-defined]

    call_command("migrate", verbosity=0)
    changes = {"name": "poll cost", "target_url": "https://shop.example/", "capacity": 1, "state": "paused"}
    services.queue_configure(slug="pollcost", changes=changes, actor_label="bench")
    client = Client()
    auths = []
    for _ in range(200):
        body = client.post(
            "/api/v1/queues/pollcost/join", content_type="application/json", HTTP_X_VISITOR_ID=str(uuid.uuid4())
        ).json()
        auths.append(f"Bearer {body['ticket']}")
    poll = _looped(auths) if args.loop else _threaded(auths, status_answer)
    if args.join:
        poll = _looped([], join=True)
    try:
        poll(len(auths))
        runs = []
        for _ in range(args.runs):
            started = time.perf_counter()
            poll(args.polls)
            runs.append((time.perf_counter() - started) / args.polls * 1e6)
        path = "event loop" if args.loop or args.join else "Django's thread"
        what = "join" if args.join else "poll"
        print(f"{tree} ({path}): µs per {what} {[round(r, 1) for r in runs]}, median {statistics.median(runs):.1f}")
        if args.profile:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            profile.runcall(poll, args.polls)
            pstats.Stats(profile).sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(args.profile)
    finally:
        keys = list(store.client().scan_iter(match=f"{prefix}*"))
        if keys:
            store.client().delete(*keys)
        Path(f"/tmp/{prefix}.sqlite3").unlink(missing_ok=True)


def _threaded(auths: list[str], status_answer: Any) -> Any:
    def poll(count: int) -> None:
        for i in range(count):
            status_answer(auths[i % len(auths)], "pollcost")

    return poll


def _looped(auths: list[str], *, join: bool = False) -> Any:
    """Polls (or joins) through the ASGI application on one event loop, as the web server calls it."""
    import asyncio

    from waitingroom_site.web import application

    loop = asyncio.new_event_loop()
    headers = [[(b"host", b"testserver"), (b"authorization", auth.encode())] for auth in auths]
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}" if join else b"", "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def polls(count: int) -> None:
        for i in range(count):
            scope = {
                "type": "http",
                "method": "POST" if join else "GET",
                "scheme": "http",
                "path": f"/api/v1/queues/pollcost/{'join' if join else 'status'}",
                "query_string": b"",
                "headers": _joiner() if join else headers[i % len(headers)],
                "client": ("127.0.0.1", 40000),
                "server": ("testserver", 80),
            }
            await application(scope, receive, send)
        if set(statuses) != {201 if join else 200}:
            raise SystemExit(f"polls answered {sorted(set(statuses))}")
        statuses.clear()

    return lambda count: loop.run_until_complete(polls(count))


def _joiner() -> list[tuple[bytes, bytes]]:
    """A new visitor's join headers (its own identity: a new ticket each)."""
    visitor = uuid.uuid4().hex.encode()
    return [(b"host", b"testserver"), (b"content-type", b"application/json"), (b"x-visitor-id", visitor)]


if __name__ == "__main__":
    main()
